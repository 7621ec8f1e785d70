//! Communicators: the operations a parallel forward needs between the ranks of a run, over
//! host buffers.
//!
//! A [`Communicator`] is a group of ranks `0..size()`: the whole run (the world), or one
//! tensor-parallel group. Every collective must be called by every rank of the group, in the
//! same order, with buffers of the same length; a point-to-point [`Communicator::send`] is
//! matched by one [`Communicator::recv`] of the same length on the other rank. Calls are
//! blocking and an error means the run cannot go on: callers end the job
//! ([`Communicator::abort`]) rather than continue with ranks out of step.
//!
//! Implementations: [`SingleProcess`] (one rank; every collective is free) and, with the `mpi`
//! feature, `MpiCommunicator` (`comm::mpi`). An NCCL communicator for GPU ranks offers the
//! same operations on device buffers; until it exists, a backend on a device hands these
//! host buffers to the operations (see the models crate's `Backend::host_rows`).

#[cfg(feature = "mpi")]
pub mod mpi;

use crate::Result;

/// A group of ranks that exchange host buffers.
pub trait Communicator: Send + Sync + std::fmt::Debug {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Element-wise sum of `buf` over every rank, left in every rank's `buf`.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;
    /// Every rank's `local` (all of one length), concatenated in rank order into `out`
    /// (`size() * local.len()` long).
    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()>;
    /// The root's `buf` (any length) replaces every other rank's.
    fn broadcast(&self, buf: &mut Vec<u32>, root: usize) -> Result<()>;
    /// Every rank's `local` bytes (all of one length), concatenated in rank order: for small
    /// status messages.
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>>;
    /// Sends `buf` to rank `dest`.
    fn send(&self, buf: &[f32], dest: usize) -> Result<()>;
    /// Receives exactly `buf.len()` values from rank `src`.
    fn recv(&self, buf: &mut [f32], src: usize) -> Result<()>;
    /// Ends every process of the run with exit status `code`.
    fn abort(&self, code: i32) -> !;
}

/// The run of one process: rank 0 of 1. Collectives cost nothing; there is no peer to send to.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        if out.len() != local.len() {
            return Err(crate::RuntimeError::Comm(format!(
                "all-gather of {} values into {}",
                local.len(),
                out.len()
            )));
        }
        out.copy_from_slice(local);
        Ok(())
    }

    fn broadcast(&self, _buf: &mut Vec<u32>, _root: usize) -> Result<()> {
        Ok(())
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>> {
        Ok(local.to_vec())
    }

    fn send(&self, _buf: &[f32], dest: usize) -> Result<()> {
        Err(crate::RuntimeError::Comm(format!(
            "a single process has no rank {dest} to send to"
        )))
    }

    fn recv(&self, _buf: &mut [f32], src: usize) -> Result<()> {
        Err(crate::RuntimeError::Comm(format!(
            "a single process has no rank {src} to receive from"
        )))
    }

    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_reduces_to_itself_and_has_no_peers() {
        let c = SingleProcess;
        let mut v = vec![1.0, 2.0];
        c.all_reduce_sum(&mut v).unwrap();
        assert_eq!(v, [1.0, 2.0]);
        let mut out = [0.0; 2];
        c.all_gather(&v, &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0]);
        assert!(c.all_gather(&v, &mut [0.0; 3]).is_err());
        let mut b = vec![7];
        c.broadcast(&mut b, 0).unwrap();
        assert_eq!(b, [7]);
        assert_eq!(c.all_gather_bytes(b"ok").unwrap(), b"ok");
        let err = c.send(&v, 1).unwrap_err().to_string();
        assert!(err.contains("no rank 1"), "{err}");
        assert!(c.recv(&mut v, 1).is_err());
    }
}
