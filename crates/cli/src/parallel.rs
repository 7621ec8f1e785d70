//! Parallel runs from the command line: `mpirun -n N ferrum serve --model M
//! --tensor-parallel-size T --pipeline-parallel-size P` (N = T x P).
//!
//! Every rank parses the same flags and loads its shard. Rank 0 goes on as a normal run (the
//! engine, the server or the benchmark, whose model steps every rank); the other ranks run
//! rank 0's steps until it stops, then leave without output. MPI is initialised only for a
//! parallel layout or a process that `mpirun` started with others, and finalised when
//! [`Launch`] is dropped at the end of `main` (a worker finalises before it exits).

use crate::common::ModelArgs;
use anyhow::{bail, Result};
use ferrum_models::parallel::Layout;
use ferrum_models::{LoadOptions, Model};
use std::path::Path;

/// Ranks the process manager says the job has (Open MPI, MPICH/Hydra, Slurm's srun), if any.
fn launched_world_size() -> Option<usize> {
    // Set for each launched process (not for a batch script around it).
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// This process's rank among the job's processes on its node (0 when unknown).
#[cfg(feature = "mpi")]
fn local_rank() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

/// The process's place in a parallel run: MPI, once initialised.
#[derive(Default)]
pub struct Launch {
    #[cfg(feature = "mpi")]
    mpi: std::sync::Mutex<Option<ferrum_runtime::comm::mpi::MpiRuntime>>,
}

impl Launch {
    /// Whether `layout` (or the way the process was started) makes this a parallel run.
    pub fn is_parallel(layout: &Layout) -> bool {
        layout.is_parallel() || launched_world_size().is_some_and(|n| n > 1)
    }

    /// Loads this rank's shard of the model at `path`. Rank 0 gets it back; any other rank
    /// serves rank 0's steps and exits here.
    #[cfg(not(feature = "mpi"))]
    pub fn load(
        &self,
        _path: &Path,
        _args: &ModelArgs,
        _opts: &LoadOptions,
        layout: &Layout,
    ) -> Result<Model> {
        match launched_world_size() {
            Some(n) if n > 1 && !layout.is_parallel() => bail!(
                "mpirun started {n} copies of a ferrum built without MPI: build with `cargo build --release --features mpi` and pass --tensor-parallel-size/--pipeline-parallel-size"
            ),
            _ => bail!(
                "--tensor-parallel-size {} --pipeline-parallel-size {} needs MPI: build with `cargo build --release --features mpi` and launch with `mpirun -n {}`",
                layout.tensor_parallel,
                layout.pipeline_parallel,
                layout.world_size()
            ),
        }
    }

    /// Loads this rank's shard of the model at `path`. Rank 0 gets it back; any other rank
    /// serves rank 0's steps and exits here.
    #[cfg(feature = "mpi")]
    pub fn load(
        &self,
        path: &Path,
        args: &ModelArgs,
        opts: &LoadOptions,
        layout: &Layout,
    ) -> Result<Model> {
        use crate::common::DeviceArg;
        use ferrum_models::parallel::{check_loaded, Comms};
        use ferrum_models::{load_model_sharded, ModelError};
        use ferrum_runtime::{Communicator, Device};
        use std::sync::Arc;

        let mut guard = self.runtime()?;
        let Some(rt) = guard.as_ref() else {
            bail!("MPI did not start")
        };
        let world = Arc::new(rt.world());
        let (rank, size) = (world.rank(), world.size());
        // Before any collective: rank 0 says why, the others leave quietly.
        if let Err(e) = layout.check_world_size(size) {
            if rank == 0 {
                return Err(e.into());
            }
            drop(world);
            guard.take();
            std::process::exit(1)
        }
        let node = rt.node_name()?;
        check_tp_groups(world.as_ref(), &node, layout.tensor_parallel)?;
        let tp = Arc::new(world.split(rank / layout.tensor_parallel)?);
        let device = match args.device {
            // Each rank of a node on its own GPU: `cuda:N` is the node's first rank's.
            DeviceArg::Fixed(Device::Cuda(n)) => Device::Cuda(n + local_rank()),
            DeviceArg::Fixed(d) => d,
            // Each rank on the CPU unless told otherwise: ranks must not race for GPU 0.
            DeviceArg::Auto => Device::Cpu,
        };
        let comms = Comms {
            world: world.clone(),
            tp,
        };
        let loaded = load_model_sharded(path, opts, device, layout, comms);
        let status = match &loaded {
            Ok(_) => Ok(()),
            Err(e) => Err(ModelError::Invalid(e.to_string())),
        };
        let checked = check_loaded(world.as_ref(), &node, status);
        let mut loaded = loaded;
        if checked.is_err() {
            // The other ranks stop here too: rank 0's model must not call on them.
            if let Ok(m) = loaded.as_mut() {
                m.disarm_parallel();
            }
        }
        let model = match (checked, loaded) {
            (Ok(()), Ok(model)) => model,
            (Err(e), _) if rank == 0 => return Err(e.into()),
            (Ok(()), Err(e)) if rank == 0 => return Err(e.into()),
            // Rank 0 reports every rank's failure; the others leave quietly.
            _ => {
                drop(world);
                guard.take();
                std::process::exit(1)
            }
        };
        if rank == 0 {
            return Ok(model);
        }
        drop(guard);
        ignore_stop_signals();
        let served = model.run_worker();
        drop(world);
        if let Err(e) = served {
            eprintln!("ferrum: rank {rank}: {e}");
        }
        // Finalise, then leave: a worker has no output of its own.
        if let Ok(mut g) = self.mpi.lock() {
            g.take();
        }
        std::process::exit(0)
    }
}

/// A worker ends when rank 0 says so (or the job is torn down, which kills it): the SIGTERM and
/// SIGINT that `mpirun` forwards to every rank must not end it before rank 0's graceful
/// shutdown has finished its last steps.
#[cfg(feature = "mpi")]
fn ignore_stop_signals() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to "ignore" installs no handler code; nothing
    // else in a worker installs handlers.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
}

impl Launch {
    /// MPI, initialised on first use; held (locked) by the caller.
    #[cfg(feature = "mpi")]
    fn runtime(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Option<ferrum_runtime::comm::mpi::MpiRuntime>>> {
        let mut guard = self
            .mpi
            .lock()
            .map_err(|_| anyhow::anyhow!("the MPI state was poisoned"))?;
        if guard.is_none() {
            *guard = Some(ferrum_runtime::comm::mpi::MpiRuntime::init()?);
        }
        Ok(guard)
    }

    /// Runs `f` over every rank of the job (initialising MPI).
    #[cfg(feature = "mpi")]
    pub fn with_world(
        &self,
        f: &mut dyn FnMut(&dyn ferrum_runtime::Communicator) -> Result<()>,
    ) -> Result<()> {
        let guard = self.runtime()?;
        let Some(rt) = guard.as_ref() else {
            bail!("MPI did not start")
        };
        f(&rt.world())
    }

    /// Runs `f` over every rank of the job: needs MPI.
    #[cfg(not(feature = "mpi"))]
    pub fn with_world(
        &self,
        _f: &mut dyn FnMut(&dyn ferrum_runtime::Communicator) -> Result<()>,
    ) -> Result<()> {
        bail!("this needs MPI: build with `cargo build --release --features mpi` and launch with mpirun")
    }
}

/// Checks that the ranks of each tensor-parallel group (consecutive ranks) share a node.
#[cfg(feature = "mpi")]
fn check_tp_groups(world: &dyn ferrum_runtime::Communicator, node: &str, tp: usize) -> Result<()> {
    const NAME: usize = 256;
    let mut mine = [0u8; NAME];
    let n = node.len().min(NAME);
    mine[..n].copy_from_slice(&node.as_bytes()[..n]);
    let all = world.all_gather_bytes(&mine)?;
    let names: Vec<String> = all
        .chunks_exact(NAME)
        .map(|c| {
            let len = c.iter().position(|&b| b == 0).unwrap_or(NAME);
            String::from_utf8_lossy(&c[..len]).into_owned()
        })
        .collect();
    for (g, group) in names.chunks(tp).enumerate() {
        if let Some(other) = group.iter().find(|n| *n != &group[0]) {
            bail!(
                "the tensor-parallel group of ranks {}..{} spans nodes {} and {other}: a group must sit on one node (place ranks by slot, e.g. mpirun --map-by slot)",
                g * tp,
                g * tp + group.len() - 1,
                group[0]
            );
        }
    }
    Ok(())
}
