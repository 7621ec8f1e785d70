//! [`SharedGpu`], a device several owners use, and [`DeviceBuffer`], memory that frees itself.
//!
//! A model's weights, its workspaces and its KV cache are separate owners of memory on one
//! device; each [`DeviceBuffer`] keeps the device alive and returns its memory when dropped.
//! Operations lock the device for their duration: one stream, issue order.

use std::sync::{Arc, Mutex, MutexGuard};

use super::gpu::{DevicePtr, Gpu};
use crate::{Result, RuntimeError};

/// A [`Gpu`] shared by the buffers allocated on it.
#[derive(Debug, Clone)]
pub struct SharedGpu(Arc<Mutex<Gpu>>);

impl SharedGpu {
    /// Shares `gpu`.
    pub fn new(gpu: Gpu) -> SharedGpu {
        SharedGpu(Arc::new(Mutex::new(gpu)))
    }

    /// Exclusive use of the device until the guard drops. A panic while it was held (a bug)
    /// leaves the device usable: its state is the driver's, not the lock's.
    pub fn lock(&self) -> MutexGuard<'_, Gpu> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `bytes` (contents undefined).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let ptr = self.lock().alloc(bytes)?;
        Ok(DeviceBuffer {
            gpu: self.clone(),
            ptr,
            bytes,
        })
    }

    /// A buffer holding `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.alloc(data.len())?;
        self.lock().write(buf.ptr, data)?;
        Ok(buf)
    }
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    gpu: SharedGpu,
    ptr: DevicePtr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Its address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The address `bytes` in, checked against the size.
    pub fn at(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes > self.bytes {
            return Err(RuntimeError::Kernels(format!(
                "offset {bytes} is past a {}-byte device buffer",
                self.bytes
            )));
        }
        Ok(self.ptr.offset(bytes))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A failure here has nowhere to go; the device reports it on its next operation.
        let _ = self.gpu.lock().free(self.ptr);
    }
}
