//! One host-visible staging buffer that the weight upload fills and copies from, reused for the
//! whole model: a checkpoint reaches the device through a fixed amount of host memory (the
//! buffer's size), with no staging allocation per write (`Queue::write_buffer` allocates one per
//! call and frees it only after a submission).

use crate::context::GpuContext;
use crate::error::GpuError;

/// A mapped staging buffer and the copies recorded out of it since the last flush.
pub(crate) struct StagingBelt {
    buffer: wgpu::Buffer,
    size: u64,
    used: u64,
    mapped: bool,
    encoder: Option<wgpu::CommandEncoder>,
}

impl StagingBelt {
    /// A belt of `size` bytes (a multiple of 4).
    pub(crate) fn new(ctx: &GpuContext, size: u64) -> Result<Self, GpuError> {
        let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
        let buffer = ctx.buffer_mapped("upload staging", size, usage)?;
        Ok(StagingBelt { buffer, size, used: 0, mapped: true, encoder: None })
    }

    /// Copies `bytes` (a multiple of 4, at most the belt's size) to `dst` at `offset`, through the
    /// belt; flushes first when the belt is full. Each write starts at a multiple of
    /// `wgpu::MAP_ALIGNMENT` (8) in the belt, where a mapped range must start, so a write of a
    /// length that is 4 modulo 8 (an odd count of f32 values) leaves a 4-byte gap after it.
    pub(crate) fn write(&mut self, ctx: &GpuContext, dst: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<(), GpuError> {
        let len = bytes.len() as u64;
        assert!(len.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) && len <= self.size, "staging write of {len} bytes");
        if self.used + len > self.size {
            self.flush(ctx)?;
        }
        if !self.mapped {
            self.map(ctx)?;
        }
        let range = self.used..self.used + len;
        let mut view = self.buffer.get_mapped_range_mut(range).map_err(|e| GpuError::Readback(e.to_string()))?;
        view.slice(..).copy_from_slice(bytes);
        drop(view);
        let encoder = self
            .encoder
            .get_or_insert_with(|| ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("upload") }));
        encoder.copy_buffer_to_buffer(&self.buffer, self.used, dst, offset, len);
        self.used = (self.used + len).next_multiple_of(wgpu::MAP_ALIGNMENT).min(self.size);
        Ok(())
    }

    /// Submits the recorded copies and waits for them, so the belt can be refilled.
    pub(crate) fn flush(&mut self, ctx: &GpuContext) -> Result<(), GpuError> {
        if self.mapped {
            self.buffer.unmap();
            self.mapped = false;
        }
        if let Some(encoder) = self.encoder.take() {
            ctx.queue.submit(Some(encoder.finish()));
        }
        ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
        self.used = 0;
        Ok(())
    }

    fn map(&mut self, ctx: &GpuContext) -> Result<(), GpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            let _ = tx.send(r);
        });
        ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.recv().map_err(|e| GpuError::Readback(e.to_string()))?.map_err(|e| GpuError::Readback(e.to_string()))?;
        self.mapped = true;
        Ok(())
    }
}
