//! A decoder layer run with another router's experts (`CpuModel::decoder_layer_routed`, what the
//! GPU checks use to explain a top-k flip): with its own router's choice it gives the bits of the
//! plain layer, and with one token's expert swapped only that token's row changes.

use std::path::Path;

use dg_cpu::CpuModel;
use dg_model::ModelDir;

#[test]
fn a_layer_with_chosen_experts_changes_only_the_rows_they_route() {
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let mut model = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    let text = model.config.text.clone();
    let (c, h, e, k) = (model.config.canvas_length, text.hidden_size, text.num_experts, text.top_k_experts);
    model.encode(&(0..20u32).map(|i| 3 + i * 11 % 900).collect::<Vec<_>>()).unwrap();
    let canvas: Vec<u32> = (0..c as u32).map(|i| 5 + i * 37 % 900).collect();
    let input = model.decoder_input(&canvas, None);
    for layer in 0..text.num_layers() {
        let mut plain = input.clone();
        model.decoder_layers(&mut plain, c, layer..layer + 1);
        let mut own = input.clone();
        let trace = model.decoder_layer_routed(&mut own, c, layer, None);
        assert!(own == plain, "layer {layer}: the traced layer differs from the plain one");
        assert_eq!(trace.logits.len(), c * e);
        let mut again = input.clone();
        model.decoder_layer_routed(&mut again, c, layer, Some(&trace.routing.experts));
        assert!(again == plain, "layer {layer}: the router's own choice, given, gives other bits");
        // Token 3's last expert swapped for one it did not choose.
        let mut chosen = trace.routing.experts.clone();
        let row = &mut chosen[3 * k..4 * k];
        let other = (0..e).find(|x| !row.contains(x)).unwrap();
        row[k - 1] = other;
        let mut swapped = input.clone();
        model.decoder_layer_routed(&mut swapped, c, layer, Some(&chosen));
        for t in 0..c {
            let same = swapped[t * h..(t + 1) * h] == plain[t * h..(t + 1) * h];
            assert_eq!(same, t != 3, "layer {layer} token {t}: changed {}", !same);
        }
    }
}
