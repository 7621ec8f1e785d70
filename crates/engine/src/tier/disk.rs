//! [`DiskTier`]: full KV blocks kept as files in a folder, so a prefix outlives the pool and
//! the process. The engine thread owns the index ([`TierIndex`]: what is there, what goes
//! first) and hands the I/O to a worker thread: stores (write to a name of its own, then
//! rename), reads (checked by [`file::decode`] on the worker), deletions.
//!
//! Invariants:
//! - a block read back is served only after every check of [`file::decode`] passed; one that
//!   fails is dropped from the index, counted, logged and deleted, and its request recomputes
//!   it;
//! - the folder is `<dir>/<fingerprint hex>`: files of another model or cache layout are in
//!   another folder, and one copied in anyway fails the fingerprint check;
//! - a failed write (a full disk, a read-only or vanished folder) stops further writes with
//!   one warning; reads go on while files are there;
//! - dropping the tier finishes the writes already handed to the worker (a graceful shutdown
//!   keeps what was computed).

use super::file::{self, EXT, HEADER};
use super::{warn, TierCounters};
use ferrum_scheduler::{BlockHash, TierIndex};
use ferrum_types::RequestId;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Work for the I/O thread.
#[derive(Debug)]
enum Job {
    Store {
        hash: BlockHash,
        payload: Vec<u8>,
    },
    Fetch {
        id: RequestId,
        hashes: Vec<BlockHash>,
    },
    Delete(BlockHash),
}

/// What the I/O thread did.
#[derive(Debug)]
pub enum Done {
    Stored {
        hash: BlockHash,
        error: Option<String>,
    },
    /// A request's blocks, read and checked in order, up to the first that was missing or bad.
    Fetched {
        id: RequestId,
        blocks: Vec<(BlockHash, Vec<u8>)>,
        /// The block the run stopped at and why (`None`: missing, not bad).
        stopped: Option<(BlockHash, Option<String>)>,
        seconds: f64,
    },
}

/// A temporary file left this long is a crashed writer's.
const STALE_TMP: Duration = Duration::from_secs(600);

/// The disk tier of one engine; see the module docs.
#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    block_bytes: usize,
    index: TierIndex,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    worker: Option<JoinHandle<()>>,
    writable: bool,
}

fn path_of(dir: &Path, hash: BlockHash) -> PathBuf {
    dir.join(format!("{}.{EXT}", hash.to_hex()))
}

impl DiskTier {
    /// Opens (creating) `<root>/<fingerprint hex>`, indexes the block files a previous run
    /// left there (oldest first, beyond `max_bytes` deleted), and starts the I/O thread.
    pub fn open(
        root: &Path,
        max_bytes: u64,
        fingerprint: [u8; 32],
        block_bytes: usize,
        counters: &mut TierCounters,
    ) -> Result<DiskTier, String> {
        let hex: String = fingerprint[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = root.join(hex);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut found = Vec::new();
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.starts_with('.') && name.ends_with(".tmp") {
                if now.duration_since(modified).unwrap_or_default() > STALE_TMP {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let hash = name
                .strip_suffix(&format!(".{EXT}"))
                .and_then(BlockHash::from_hex);
            if let (Some(hash), true) = (hash, meta.is_file()) {
                found.push((modified, hash, meta.len()));
            }
        }
        found.sort();
        let mut index = TierIndex::new(max_bytes);
        for (_, hash, len) in found {
            for old in index.insert(hash, len) {
                let _ = std::fs::remove_file(path_of(&dir, old));
                counters.evictions += 1;
            }
        }
        let (jobs, rx) = channel();
        let (tx, done) = channel();
        let worker_dir = dir.clone();
        let worker = std::thread::Builder::new()
            .name("ferrum-kv-disk".into())
            .spawn(move || work(&worker_dir, fingerprint, block_bytes, &rx, &tx))
            .map_err(|e| format!("cannot start the I/O thread: {e}"))?;
        Ok(DiskTier {
            dir,
            block_bytes,
            index,
            jobs: Some(jobs),
            done,
            worker: Some(worker),
            writable: true,
        })
    }

    /// The folder of this cache's blocks.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn index(&self) -> &TierIndex {
        &self.index
    }

    pub fn holds(&self, hash: BlockHash) -> bool {
        self.index.contains(hash)
    }

    fn send(&self, job: Job) {
        if let Some(j) = &self.jobs {
            let _ = j.send(job);
        }
    }

    /// Keeps a copy of a block (the worker writes it), unless it is here already or writes
    /// have stopped. Room is made by evicting what the index lets go first.
    pub fn store(&mut self, hash: BlockHash, payload: Vec<u8>, counters: &mut TierCounters) {
        if !self.writable || self.index.contains(hash) {
            return;
        }
        for old in self.index.insert(hash, (HEADER + payload.len()) as u64) {
            if old != hash {
                counters.evictions += 1;
                self.send(Job::Delete(old));
            }
        }
        if self.index.contains(hash) {
            counters.bytes_written += payload.len() as u64;
            self.send(Job::Store { hash, payload });
        }
    }

    /// Asks for a request's blocks, read and checked in order (an answer comes from
    /// [`DiskTier::poll`]).
    pub fn fetch(&mut self, id: RequestId, hashes: Vec<BlockHash>) {
        self.send(Job::Fetch { id, hashes });
    }

    /// What the worker finished since the last call, with the index and counters updated:
    /// good blocks are hits (touched), a bad file is forgotten and deleted, a missing one
    /// forgotten, a failed write stops writes.
    pub fn poll(&mut self, counters: &mut TierCounters) -> Vec<Done> {
        let mut out = Vec::new();
        while let Ok(done) = self.done.try_recv() {
            match &done {
                Done::Stored { hash, error } => {
                    if let Some(e) = error {
                        self.index.remove(*hash);
                        counters.write_failures += 1;
                        if self.writable {
                            self.writable = false;
                            warn(&format!(
                                "writing to {} failed ({e}): no more blocks are written to disk \
                                 in this run; those already there are still read",
                                self.dir.display()
                            ));
                        }
                    }
                }
                Done::Fetched {
                    blocks,
                    stopped,
                    seconds,
                    ..
                } => {
                    counters.read_seconds += seconds;
                    for (h, b) in blocks {
                        self.index.touch(*h);
                        counters.hits += 1;
                        counters.bytes_read += b.len() as u64;
                    }
                    if let Some((h, why)) = stopped {
                        self.index.remove(*h);
                        if let Some(why) = why {
                            counters.bad_files += 1;
                            warn(&format!(
                                "ignored {}: {why}; the block is recomputed",
                                path_of(&self.dir, *h).display()
                            ));
                            self.send(Job::Delete(*h));
                        }
                    }
                }
            }
            out.push(done);
        }
        counters.blocks = self.index.len() as u64;
        counters.bytes = self.index.used();
        out
    }

    /// Bytes of one block's payload.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }
}

impl DiskTier {
    /// Lets the worker finish what it was given (the writes of a graceful shutdown), then
    /// ends it; [`DiskTier::poll`] still reports what it did.
    pub fn close(&mut self) {
        // Closing the queue ends the worker's loop once it is empty.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.close();
    }
}

/// The I/O thread: runs jobs until the queue closes.
fn work(
    dir: &Path,
    fingerprint: [u8; 32],
    block_bytes: usize,
    jobs: &Receiver<Job>,
    done: &Sender<Done>,
) {
    let mut written = 0u64;
    for job in jobs {
        match job {
            Job::Store { hash, payload } => {
                let bytes = file::encode(&fingerprint, hash, &payload);
                written += 1;
                let tmp = dir.join(format!(
                    ".{}.{}.{written}.tmp",
                    hash.to_hex(),
                    std::process::id()
                ));
                let error = std::fs::write(&tmp, &bytes)
                    .and_then(|()| std::fs::rename(&tmp, path_of(dir, hash)))
                    .err()
                    .map(|e| {
                        let _ = std::fs::remove_file(&tmp);
                        e.to_string()
                    });
                let _ = done.send(Done::Stored { hash, error });
            }
            Job::Fetch { id, hashes } => {
                let started = Instant::now();
                let mut blocks = Vec::new();
                let mut stopped = None;
                for h in hashes {
                    match std::fs::read(path_of(dir, h)) {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            stopped = Some((h, None));
                            break;
                        }
                        Err(e) => {
                            stopped = Some((h, Some(format!("cannot read it: {e}"))));
                            break;
                        }
                        Ok(bytes) => match file::decode(bytes, &fingerprint, h, block_bytes) {
                            Ok(payload) => blocks.push((h, payload)),
                            Err(why) => {
                                stopped = Some((h, Some(why)));
                                break;
                            }
                        },
                    }
                }
                let seconds = started.elapsed().as_secs_f64();
                let _ = done.send(Done::Fetched {
                    id,
                    blocks,
                    stopped,
                    seconds,
                });
            }
            Job::Delete(h) => {
                let _ = std::fs::remove_file(path_of(dir, h));
            }
        }
    }
}
