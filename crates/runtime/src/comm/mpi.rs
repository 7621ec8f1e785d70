//! The communicator over MPI (the `mpi` feature): Open MPI, MPICH or a cluster's own library,
//! launched by `mpirun`/`srun`.
//!
//! MPI is initialised once per process ([`MpiRuntime::init`]) with `MPI_THREAD_MULTIPLE`, so a
//! communicator may move to the engine thread; each communicator is still used by one thread
//! at a time (the engine's or a worker's loop). MPI's default error handler is kept: a failed
//! call (a peer that died included) ends the whole job with MPI's own message naming the rank,
//! so no call returns half done and no rank waits forever. Dropping the [`MpiRuntime`]
//! finalises MPI: drop every communicator first.

use super::Communicator;
use crate::{Result, RuntimeError};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Equivalence, Root};
use mpi::Threading;
use std::sync::Mutex;

/// MPI, initialised: finalised when dropped.
pub struct MpiRuntime {
    universe: Universe,
}

impl std::fmt::Debug for MpiRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRuntime").finish_non_exhaustive()
    }
}

impl MpiRuntime {
    /// Initialises MPI; an error when it was already, or when the library cannot serve a
    /// communicator from several threads.
    pub fn init() -> Result<MpiRuntime> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| RuntimeError::Comm("MPI is already initialised".into()))?;
        if threading != Threading::Multiple {
            return Err(RuntimeError::Comm(format!(
                "this MPI library offers {threading:?} threading; Ferrum needs MPI_THREAD_MULTIPLE"
            )));
        }
        Ok(MpiRuntime { universe })
    }

    /// Every process of the job.
    pub fn world(&self) -> MpiCommunicator {
        MpiCommunicator::new(self.universe.world().duplicate())
    }

    /// The name of this process's node (`MPI_Get_processor_name`).
    pub fn node_name(&self) -> Result<String> {
        mpi::environment::processor_name()
            .map_err(|e| RuntimeError::Comm(format!("the node's name: {e}")))
    }
}

/// A group of MPI ranks (`MPI_Comm`).
pub struct MpiCommunicator {
    comm: SimpleCommunicator,
    /// The all-reduce's send buffer: kept, so a warm step allocates nothing.
    scratch: Mutex<Vec<f32>>,
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MpiCommunicator(rank {} of {})",
            self.rank(),
            self.size()
        )
    }
}

// SAFETY: MPI runs with MPI_THREAD_MULTIPLE (checked by `MpiRuntime::init`, the only way to
// make a communicator), under which MPI calls may come from any thread; the communicator
// handle is an opaque MPI object with no thread affinity.
unsafe impl Send for MpiCommunicator {}
// SAFETY: as for `Send`; the only Rust-side state, the scratch buffer, is behind a mutex.
unsafe impl Sync for MpiCommunicator {}

impl MpiCommunicator {
    fn new(comm: SimpleCommunicator) -> MpiCommunicator {
        MpiCommunicator {
            comm,
            scratch: Mutex::new(Vec::new()),
        }
    }

    /// Splits the group: ranks that pass the same `color` form one new group, ordered by
    /// their rank here. Every rank of this group must call it.
    pub fn split(&self, color: usize) -> Result<MpiCommunicator> {
        let color = i32::try_from(color)
            .map_err(|_| RuntimeError::Comm(format!("group colour {color} is too large")))?;
        self.comm
            .split_by_color(Color::with_value(color))
            .map(MpiCommunicator::new)
            .ok_or_else(|| RuntimeError::Comm("MPI_Comm_split gave no group".into()))
    }

    fn rank_of(&self, r: usize) -> Result<i32> {
        match i32::try_from(r) {
            Ok(v) if r < self.size() => Ok(v),
            _ => Err(RuntimeError::Comm(format!(
                "rank {r} is outside a group of {}",
                self.size()
            ))),
        }
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let mut send = self
            .scratch
            .lock()
            .map_err(|_| RuntimeError::Comm("the all-reduce buffer was poisoned".into()))?;
        send.clear();
        send.extend_from_slice(buf);
        self.comm
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        if out.len() != local.len() * self.size() {
            return Err(RuntimeError::Comm(format!(
                "all-gather of {} values from {} ranks into {}",
                local.len(),
                self.size(),
                out.len()
            )));
        }
        self.comm.all_gather_into(local, out);
        Ok(())
    }

    fn broadcast(&self, buf: &mut Vec<u32>, root: usize) -> Result<()> {
        let root = self.comm.process_at_rank(self.rank_of(root)?);
        let mut len = buf.len() as u64;
        root.broadcast_into(&mut len);
        let len = usize::try_from(len)
            .map_err(|_| RuntimeError::Comm(format!("a broadcast of {len} values")))?;
        buf.resize(len, 0);
        root.broadcast_into(&mut buf[..]);
        Ok(())
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; local.len() * self.size()];
        self.comm.all_gather_into(local, &mut out[..]);
        Ok(out)
    }

    fn send(&self, buf: &[f32], dest: usize) -> Result<()> {
        self.comm.process_at_rank(self.rank_of(dest)?).send(buf);
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize) -> Result<()> {
        let status = self
            .comm
            .process_at_rank(self.rank_of(src)?)
            .receive_into(buf);
        let got = status.count(f32::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(RuntimeError::Comm(format!(
                "expected {} values from rank {src}, got {got}",
                buf.len()
            )));
        }
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}
