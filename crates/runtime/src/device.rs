//! Where a model runs: the CPU, a CUDA GPU, or the interpreted device (the CUDA backend's
//! kernels in the Triton interpreter on the host: for tests, and to debug the GPU path on a
//! machine without one; slow).

use std::fmt;
use std::str::FromStr;

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory and the CPU kernels in [`crate::cpu`].
    #[default]
    Cpu,
    /// CUDA device `N` ([`crate::cuda::Gpu::cuda`]).
    Cuda(usize),
    /// The CUDA backend on the interpreted device ([`crate::cuda::Gpu::interpreted`]).
    Interpreted,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Interpreted => f.write_str("interpreted"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0), `cuda:N`, or `interpreted`.
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "interpreted" => Ok(Device::Interpreted),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    format!("unknown device `{s}`: expected cpu, cuda, cuda:N or interpreted")
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        for (s, d) in [
            ("cpu", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
            ("interpreted", Device::Interpreted),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
        }
        assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(
                e.contains("expected cpu, cuda, cuda:N or interpreted"),
                "{e}"
            );
        }
    }
}
