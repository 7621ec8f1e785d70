//! Host-side helpers of the kernel tests: seeded values, float element types as the kernels
//! see them, uploads, NaN-poisoned outputs and the bound every output is checked against.

use ferrum_runtime::cuda::{DevicePtr, Gpu, KernelArg};
use ferrum_types::splitmix::SplitMix64;
use half::{bf16, f16};

pub const TOL: f64 = 2e-5;

pub struct Rng(pub SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.0.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }
}

/// A float element type as the kernels see it.
#[derive(Debug, Clone, Copy)]
pub enum Float {
    F32,
    F16,
    Bf16,
}

impl Float {
    pub const ALL: [Float; 3] = [Float::F32, Float::F16, Float::Bf16];
    pub fn short(self) -> &'static str {
        match self {
            Float::F32 => "f32",
            Float::F16 => "f16",
            Float::Bf16 => "bf16",
        }
    }
    pub fn round(self, v: f32) -> f32 {
        match self {
            Float::F32 => v,
            Float::F16 => f16::from_f32(v).to_f32(),
            Float::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }
    pub fn bytes(self, data: &[f32]) -> Vec<u8> {
        match self {
            Float::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Float::F16 => data
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            Float::Bf16 => data
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }
    pub fn size(self) -> usize {
        match self {
            Float::F32 => 4,
            _ => 2,
        }
    }
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Float::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Float::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Float::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

pub fn upload_as(gpu: &mut Gpu, ty: Float, data: &[f32]) -> DevicePtr {
    let bytes = ty.bytes(data);
    let ptr = gpu.alloc(bytes.len()).expect("alloc");
    gpu.write(ptr, &bytes).expect("write");
    ptr
}

pub fn poisoned(gpu: &mut Gpu, n: usize) -> DevicePtr {
    gpu.upload_f32(&vec![f32::NAN; n]).expect("upload")
}

#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / scale;
        assert!(
            err <= TOL,
            "{what}: element {i} is {g}, reference {w} (error {err:.2e} of max |ref| {scale:.3e})"
        );
    }
}

pub fn p(ptr: DevicePtr) -> KernelArg {
    KernelArg::Ptr(ptr)
}
pub fn i(v: usize) -> KernelArg {
    KernelArg::I32(v as i32)
}
pub fn cdiv(a: usize, b: i64) -> u32 {
    a.div_ceil(b as usize) as u32
}
