//! The CUDA backend's activation buffers: [`Grown`] device buffers reused across steps, the
//! slots the named activations live in ([`place`]), the uploaded rope frequencies, and reads of
//! small results back to the host.
//!
//! Invariant: a [`Grown`] buffer only grows (to the next power of two), so an address a graph
//! holds changes only when a buffer grows, which `graphs.rs` notices and answers by dropping
//! its graphs.

use super::*;

/// A buffer that grows and is reused.
#[derive(Debug, Default)]
pub(super) struct Grown {
    pub(super) buf: Option<DeviceBuffer>,
}

impl Grown {
    /// At least `bytes`, keeping the buffer when it is big enough (contents undefined).
    pub(super) fn ensure(&mut self, gpu: &SharedGpu, bytes: usize) -> Result<DevicePtr> {
        match &self.buf {
            Some(b) if b.len() >= bytes => Ok(b.ptr()),
            _ => {
                self.buf = None;
                let b = gpu.alloc(bytes.max(256).next_power_of_two())?;
                let ptr = b.ptr();
                self.buf = Some(b);
                Ok(ptr)
            }
        }
    }

    /// [`Grown::ensure`], zero-filled whenever it is (re)allocated: the split-K products'
    /// per-tile counts, which every launch leaves at zero for the next.
    pub(super) fn ensure_zeroed(&mut self, gpu: &SharedGpu, bytes: usize) -> Result<DevicePtr> {
        let fits = matches!(&self.buf, Some(b) if b.len() >= bytes);
        let ptr = self.ensure(gpu, bytes)?;
        if !fits {
            let len = self.buf.as_ref().map_or(0, DeviceBuffer::len);
            let zero = |e| ModelError::gpu("zeroing the split-K counts", e);
            gpu.lock().write(ptr, &vec![0u8; len]).map_err(zero)?;
        }
        Ok(ptr)
    }

    pub(super) fn ptr(&self) -> Result<DevicePtr> {
        self.buf
            .as_ref()
            .map(DeviceBuffer::ptr)
            .ok_or_else(|| ModelError::Invalid("device buffer used before begin".into()))
    }
}

/// One rope's frequencies on the device.
#[derive(Debug)]
pub(super) struct UploadedRope {
    pub(super) short: (DeviceBuffer, Vec<f32>),
    pub(super) long: Option<(DeviceBuffer, Vec<f32>)>,
    pub(super) head_dim: usize,
    pub(super) mscale: f32,
}

impl UploadedRope {
    /// The frequencies of a run of tokens: LongRoPE's long set when `long` and there is one.
    pub(super) fn freq(&self, long: bool) -> DevicePtr {
        match (&self.long, long) {
            (Some(l), true) => l.0.ptr(),
            _ => self.short.0.ptr(),
        }
    }
}

/// Slots of device memory the activation buffers live in ([`place`]).
pub(super) const SLOTS: usize = 5;

/// Where buffer `b` lives: its slot, its first column in the slot's rows, and the slot's row
/// stride (elements). Q, K and V share one slot, `[t, q + 2 kv]`, and Gate and Up one,
/// `[t, 2 intermediate]`: each is a range of columns of its slot's rows, so one product of
/// their stacked weights ([`stack_runs`]) writes them all, and every kernel that reads or
/// writes one of them takes the slot's stride.
pub(super) fn place(dims: &Dims, b: Buf) -> (usize, usize, usize) {
    let (qkv, gate_up) = (dims.q + 2 * dims.kv, 2 * dims.intermediate);
    match b {
        Buf::X => (0, 0, dims.hidden),
        Buf::H => (1, 0, dims.hidden),
        Buf::Q => (2, 0, qkv),
        Buf::K => (2, dims.q, qkv),
        Buf::V => (2, dims.q + dims.kv, qkv),
        Buf::Attn => (3, 0, dims.q),
        Buf::Gate => (4, 0, gate_up),
        Buf::Up => (4, dims.intermediate, gate_up),
    }
}

/// Copies `n` 4-byte little-endian words at `ptr` to the host through `bytes` and puts them,
/// each decoded by `word`, into `out` (cleared first); `what` names the copy in an error.
pub(super) fn read_words<T>(
    gpu: &SharedGpu,
    ptr: DevicePtr,
    n: usize,
    bytes: &mut Vec<u8>,
    out: &mut Vec<T>,
    word: fn([u8; 4]) -> T,
    what: &str,
) -> Result<()> {
    bytes.resize(4 * n, 0);
    gpu.lock()
        .read(ptr, bytes)
        .map_err(|e| ModelError::gpu(what, e))?;
    out.clear();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|c| word([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}

impl CudaBackend {
    pub(super) fn width(&self, buf: Buf) -> usize {
        self.dims.width(buf)
    }

    pub(super) fn buf(&self, b: Buf) -> Result<DevicePtr> {
        let (slot, column, _) = place(&self.dims, b);
        Ok(self.bufs[slot].ptr()?.offset(4 * column))
    }

    /// Elements from one row of `b` to the next: its slot's ([`place`]).
    pub(super) fn stride(&self, b: Buf) -> usize {
        place(&self.dims, b).2
    }

    pub(super) fn index(&self, offset: usize) -> Result<DevicePtr> {
        Ok(self.indices.ptr()?.offset(4 * offset))
    }
}
