//! A model generating from a prompt that holds images, on any backend: its first encode (the
//! prompt) places the images' rows ([`EncodeWithImages`]), later ones (committed canvases) are
//! plain, as transformers' `generate` hands `pixel_values` to its first encoder call only.

use crate::generate::DenoiseModel;
use crate::resident::ResidentModel;
use crate::resident::RowResult;
use crate::rng::CategoricalRequest;

/// A model whose encoder places image rows: the rows of the image soft tokens in `ids` take, in
/// order, `image_embeddings` (`[n, H]`) after the lookup (`DiffusionGemmaEncoderModel` with
/// `pixel_values`).
pub trait EncodeWithImages {
    type Error;
    fn encode_with_images(&mut self, ids: &[u32], image_embeddings: &[f32]) -> Result<(), Self::Error>;
}

/// `model` generating from a prompt whose image soft tokens take `image_embeddings`.
#[derive(Debug)]
pub struct ImagePrompt<M> {
    pub model: M,
    /// `[n, H]` for the prompt's n image soft tokens, until the prompt is encoded.
    pending: Option<Vec<f32>>,
}

impl<M> ImagePrompt<M> {
    pub fn new(model: M, image_embeddings: Vec<f32>) -> Self {
        ImagePrompt { model, pending: Some(image_embeddings) }
    }
}

impl<M: DenoiseModel + EncodeWithImages<Error = <M as DenoiseModel>::Error>> DenoiseModel for ImagePrompt<M> {
    type Error = <M as DenoiseModel>::Error;

    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        match self.pending.take() {
            Some(embeddings) => self.model.encode_with_images(ids, &embeddings),
            None => DenoiseModel::encode(&mut self.model, ids),
        }
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error> {
        self.model.canvas_forward(canvas, sc, logits)
    }
}

impl<M: ResidentModel + EncodeWithImages<Error = <M as ResidentModel>::Error>> ResidentModel for ImagePrompt<M> {
    type Error = <M as ResidentModel>::Error;

    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        match self.pending.take() {
            Some(embeddings) => self.model.encode_with_images(ids, &embeddings),
            None => ResidentModel::encode(&mut self.model, ids),
        }
    }

    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error> {
        self.model.denoise_rows(canvas, sc, temperature, draw, rows)
    }
}
