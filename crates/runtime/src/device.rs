//! Where tensors live and kernels run. Only the CPU exists today; CUDA joins behind a feature.

use std::fmt;

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory and the CPU kernels in [`crate::cpu`].
    #[default]
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
