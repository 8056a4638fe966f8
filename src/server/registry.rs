//! The models of a server that serves several (`serve --models-dir DIR`, or `-m` more than
//! once): the [`Catalog`] (every GGUF file, with what its header says, or why it cannot be
//! read) and the [`Registry`] (which of them are resident, loading one on the first request
//! that names it, evicting the least recently used idle one past `--models-max`, unloading
//! idle ones after `--keep-alive`). Each resident model is a whole single-model server state
//! (its own engine thread, KV pool and planner) behind its own router; a [`Lease`] counts a
//! request in flight, and a model with one is never evicted.
//!
//! Called by `multi` (the dispatch, `serve`'s set-up) and `multi_routes` (`GET /models`,
//! `/models/load`, `/models/unload`, the per-model gauges of `/metrics`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::Router;

use super::encoder_server::EncoderState;
use super::model_file::read_info;
pub use super::model_file::FileInfo;
use super::{AppState, ServeArgs};

/// One model file the server may load.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The file's stem: what requests name in `model`.
    pub id: String,
    pub path: PathBuf,
    /// The header, or why the file cannot be read (the model is listed as unavailable).
    pub info: std::result::Result<FileInfo, String>,
}

/// Every model file of `--models-dir` and the `-m` flags.
pub struct Catalog {
    pub entries: Vec<Entry>,
    /// Each model's own flags (`--models-preset`).
    pub presets: Option<super::presets::Presets>,
}

impl Catalog {
    /// The catalog when `args` ask for several models (None: the one-model server of today),
    /// refusing the flags that belong to one model.
    pub fn from_args(args: &ServeArgs) -> Result<Option<Catalog>> {
        if args.models_dir.is_none() && args.model.model.len() <= 1 && args.models_preset.is_none()
        {
            return Ok(None);
        }
        let presets = match &args.models_preset {
            Some(path) => Some(super::presets::Presets::read(path)?),
            None => None,
        };
        for (given, flag) in [
            (args.alias.is_some(), "--alias"),
            (args.chat_template.is_some(), "--chat-template"),
            (!args.cache.pin_prompt.is_empty(), "--pin-prompt"),
            (args.kv_events.is_some(), "--kv-events"),
            (args.engine.draft_model.is_some(), "--draft-model"),
        ] {
            if given {
                bail!("{flag} belongs to one model: it cannot be used with --models-dir or several -m");
            }
        }
        if args.models_max == 0 {
            bail!("--models-max must be at least 1");
        }
        let mut paths = args.model.model.clone();
        if let Some(dir) = &args.models_dir {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("reading --models-dir {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                        && !p.is_dir()
                })
                .collect();
            found.sort();
            if found.is_empty() && paths.is_empty() {
                bail!("--models-dir {} holds no .gguf file", dir.display());
            }
            paths.extend(found);
        }
        let mut named: Vec<(String, PathBuf)> = paths
            .into_iter()
            .map(|path| {
                let id = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into());
                (id, path)
            })
            .collect();
        // A preset's `model = PATH` sections, under their own names.
        named.extend(presets.iter().flat_map(|p| p.added_models()));
        if named.is_empty() {
            bail!("--models-preset names no model file and no --models-dir or -m was given");
        }
        let mut entries: Vec<Entry> = Vec::new();
        for (id, path) in named {
            if let Some(other) = entries.iter().find(|e| e.id == id) {
                // `-m` naming a file of --models-dir (or a link to it) lists it once.
                if same_file(&other.path, &path) {
                    continue;
                }
                bail!(
                    "two models are named `{id}`: {} and {}",
                    other.path.display(),
                    path.display()
                );
            }
            let info = read_info(&path);
            if let Err(e) = &info {
                eprintln!("warning: model `{id}` is unavailable: {e}");
            }
            entries.push(Entry { id, path, info });
        }
        Ok(Some(Catalog { entries, presets }))
    }
}

/// The least recently used resident model with no request in flight.
fn lru_idle(slots: &[Slot]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match &s.state {
            SlotState::Loaded(r) if r.in_flight == 0 => Some((r.last_used, i)),
            _ => None,
        })
        .min()
        .map(|(_, i)| i)
}

/// Whether `a` and `b` are the same file (links followed).
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Where a model stands, as `GET /models` says it (llama-server's router names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Unloaded,
    Loading,
    Loaded,
    /// The file cannot be read, or its last load failed: why.
    Failed(String),
}

/// Starts one model's server state (its engine) from its file and id; runs on a blocking thread.
pub type Loader = Arc<dyn Fn(&Path, &str) -> Result<Served> + Send + Sync>;

/// A resident model's server state: a decoder's (generation, and embeddings from its hidden
/// states) or an encoder's (embeddings and rerank only), each with its own worker.
#[derive(Clone)]
pub enum Served {
    Decoder(Arc<AppState>),
    Encoder(Arc<EncoderState>),
}

impl Served {
    fn same(&self, other: &Served) -> bool {
        match (self, other) {
            (Served::Decoder(a), Served::Decoder(b)) => Arc::ptr_eq(a, b),
            (Served::Encoder(a), Served::Encoder(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Bytes of its KV pool and blocks in use (an encoder keeps no cache).
    fn kv_figures(&self) -> (usize, usize) {
        match self {
            Served::Decoder(app) => (
                app.engine.kv_bytes(),
                app.engine.metrics().map(|m| m.blocks_used).unwrap_or(0),
            ),
            Served::Encoder(_) => (0, 0),
        }
    }
}

struct Resident {
    served: Served,
    router: Router,
    in_flight: usize,
    last_used: Instant,
}

enum SlotState {
    Unloaded,
    Loading,
    Loaded(Resident),
    Failed(String),
}

struct Slot {
    entry: Entry,
    state: SlotState,
    /// The idle time after which the model unloads, as the last request asked (`keep_alive`);
    /// None: `--keep-alive`.
    keep_alive: Option<KeepAlive>,
}

/// How long an idle model stays resident.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeepAlive {
    Forever,
    For(Duration),
}

/// What a request for a model gets instead of it.
pub enum Refusal {
    Unknown { available: Vec<String> },
    Unavailable(String),
}

/// The resident models and their loads.
pub struct Registry {
    slots: Mutex<Vec<Slot>>,
    /// Woken on every change of a slot (a load done, a request finished, an unload).
    changed: tokio::sync::Notify,
    loader: Loader,
    make_router: fn(&Served) -> Router,
    /// Most models resident (or loading) at once (`--models-max`).
    pub models_max: usize,
    /// `--keep-alive`.
    pub keep_alive: KeepAlive,
}

/// One model's figures for `GET /models` and `/metrics`.
pub struct View {
    pub entry: Entry,
    pub status: Status,
    pub in_flight: usize,
    /// Seconds since its last request ended (resident models).
    pub idle_secs: Option<f64>,
    pub kv_bytes: usize,
    pub weights_bytes: u64,
    pub blocks_used: usize,
}

/// A request's hold on a resident model: the model is not evicted until it is dropped.
pub struct Lease {
    registry: Arc<Registry>,
    index: usize,
    served: Served,
    pub router: Router,
    /// Whether the request counts as a use (its end restarts the idle time); a look at the
    /// figures (`/metrics?model=`) does not.
    touch: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut slots = self.registry.lock();
        if let SlotState::Loaded(r) = &mut slots[self.index].state {
            if r.served.same(&self.served) {
                r.in_flight -= 1;
                if self.touch {
                    r.last_used = Instant::now();
                }
            }
        }
        drop(slots);
        self.registry.changed.notify_waiters();
    }
}

impl Lease {
    /// Sets how long the model stays resident once idle (a request's `keep_alive`).
    pub fn set_keep_alive(&self, keep_alive: KeepAlive) {
        self.registry.lock()[self.index].keep_alive = Some(keep_alive);
    }
}

impl Registry {
    pub fn new(
        catalog: Catalog,
        loader: Loader,
        make_router: fn(&Served) -> Router,
        models_max: usize,
        keep_alive: KeepAlive,
    ) -> Arc<Registry> {
        let slots = catalog
            .entries
            .into_iter()
            .map(|entry| Slot {
                state: match &entry.info {
                    Ok(_) => SlotState::Unloaded,
                    Err(e) => SlotState::Failed(e.clone()),
                },
                entry,
                keep_alive: None,
            })
            .collect();
        Arc::new(Registry {
            slots: Mutex::new(slots),
            changed: tokio::sync::Notify::new(),
            loader,
            make_router,
            models_max,
            keep_alive,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model `id`, loading it first when it is not resident (waiting while another request
    /// loads it, or while every resident model is busy and there is no room).
    pub async fn acquire(self: &Arc<Self>, id: &str) -> Result<Lease, Refusal> {
        let mut saw_loading = false;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut slots = self.lock();
                let Some(index) = slots.iter().position(|s| s.entry.id == id) else {
                    return Err(Refusal::Unknown {
                        available: slots.iter().map(|s| s.entry.id.clone()).collect(),
                    });
                };
                let slot = &mut slots[index];
                match &mut slot.state {
                    SlotState::Loaded(r) => {
                        r.in_flight += 1;
                        r.last_used = Instant::now();
                        return Ok(Lease {
                            registry: self.clone(),
                            index,
                            served: r.served.clone(),
                            router: r.router.clone(),
                            touch: true,
                        });
                    }
                    SlotState::Loading => saw_loading = true,
                    SlotState::Failed(e) if saw_loading || slot.entry.info.is_err() => {
                        return Err(Refusal::Unavailable(e.clone()));
                    }
                    SlotState::Unloaded | SlotState::Failed(_) => {
                        if self.start_load(&mut slots, index) {
                            saw_loading = true;
                        }
                    }
                }
            }
            notified.await;
        }
    }

    /// Model `id` when it is resident, without loading it or counting a use.
    pub fn peek(self: &Arc<Self>, id: &str) -> Option<Lease> {
        let mut slots = self.lock();
        let index = slots.iter().position(|s| s.entry.id == id)?;
        let SlotState::Loaded(r) = &mut slots[index].state else {
            return None;
        };
        r.in_flight += 1;
        Some(Lease {
            registry: self.clone(),
            index,
            served: r.served.clone(),
            router: r.router.clone(),
            touch: false,
        })
    }

    /// Starts loading slot `index` when there is room, evicting the least recently used idle
    /// model when there is not; false when every resident model is busy (the caller waits).
    fn start_load(self: &Arc<Self>, slots: &mut [Slot], index: usize) -> bool {
        let resident = slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Loaded(_) | SlotState::Loading))
            .count();
        if resident >= self.models_max {
            let Some(evict) = lru_idle(slots) else {
                return false;
            };
            eprintln!(
                "edge-llm serve: unloading `{}` (least recently used; --models-max {})",
                slots[evict].entry.id, self.models_max
            );
            slots[evict].state = SlotState::Unloaded;
        }
        slots[index].state = SlotState::Loading;
        let (registry, entry) = (self.clone(), slots[index].entry.clone());
        std::thread::Builder::new()
            .name("edge-llm-load".into())
            .spawn(move || registry.load(index, &entry))
            .map(|_| true)
            .unwrap_or_else(|e| {
                slots[index].state = SlotState::Failed(format!("starting a loader thread: {e}"));
                true
            })
    }

    /// Loads slot `index` (on its own thread) and wakes whoever waits for it.
    fn load(&self, index: usize, entry: &Entry) {
        let started = Instant::now();
        eprintln!(
            "edge-llm serve: loading `{}` from {}",
            entry.id,
            entry.path.display()
        );
        let loaded = loop {
            match (self.loader)(&entry.path, &entry.id) {
                // The memory check refused it: the least recently used idle model makes room.
                Err(e) if format!("{e:#}").contains("not enough memory") => {
                    let mut slots = self.lock();
                    let Some(evict) = lru_idle(&slots) else {
                        break Err(e);
                    };
                    eprintln!(
                        "edge-llm serve: unloading `{}` (least recently used) to make room for `{}`: {e:#}",
                        slots[evict].entry.id, entry.id
                    );
                    let old = std::mem::replace(&mut slots[evict].state, SlotState::Unloaded);
                    drop(slots);
                    drop(old);
                    self.changed.notify_waiters();
                    // Its engine thread ends and hands its memory back.
                    std::thread::sleep(Duration::from_millis(500));
                }
                result => break result,
            }
        };
        let state = match loaded {
            Ok(served) => {
                eprintln!(
                    "edge-llm serve: loaded `{}` in {:.2} s",
                    entry.id,
                    started.elapsed().as_secs_f64()
                );
                SlotState::Loaded(Resident {
                    router: (self.make_router)(&served),
                    served,
                    in_flight: 0,
                    last_used: Instant::now(),
                })
            }
            Err(e) => {
                eprintln!("edge-llm serve: loading `{}` failed: {e:#}", entry.id);
                SlotState::Failed(format!("{e:#}"))
            }
        };
        self.lock()[index].state = state;
        self.changed.notify_waiters();
    }

    /// Loads `id` now (`POST /models/load`), waiting until it is resident.
    pub async fn load_now(self: &Arc<Self>, id: &str) -> Result<(), Refusal> {
        {
            // A failed load is tried again on request.
            let mut slots = self.lock();
            if let Some(s) = slots.iter_mut().find(|s| s.entry.id == id) {
                if matches!(s.state, SlotState::Failed(_)) && s.entry.info.is_ok() {
                    s.state = SlotState::Unloaded;
                }
            }
        }
        self.acquire(id).await.map(drop)
    }

    /// Unloads `id` (`POST /models/unload`): requests in flight finish on it, then its engine
    /// stops. Ok(false) when it was not resident.
    pub fn unload(&self, id: &str) -> Result<bool, Refusal> {
        let mut slots = self.lock();
        let Some(slot) = slots.iter_mut().find(|s| s.entry.id == id) else {
            return Err(Refusal::Unknown {
                available: slots.iter().map(|s| s.entry.id.clone()).collect(),
            });
        };
        let old = match slot.state {
            SlotState::Loaded(_) => std::mem::replace(&mut slot.state, SlotState::Unloaded),
            _ => return Ok(false),
        };
        drop(slots);
        drop(old);
        eprintln!("edge-llm serve: unloaded `{id}` (POST /models/unload)");
        self.changed.notify_waiters();
        Ok(true)
    }

    /// Unloads every idle model past its keep-alive; the reaper thread calls it.
    pub fn reap(&self) {
        let mut gone = Vec::new();
        let mut slots = self.lock();
        for slot in slots.iter_mut() {
            let keep = slot.keep_alive.unwrap_or(self.keep_alive);
            let expired = match (&slot.state, keep) {
                (SlotState::Loaded(r), KeepAlive::For(d)) => {
                    r.in_flight == 0 && r.last_used.elapsed() >= d
                }
                _ => false,
            };
            if expired {
                eprintln!(
                    "edge-llm serve: unloading `{}` (idle past its keep-alive)",
                    slot.entry.id
                );
                gone.push(std::mem::replace(&mut slot.state, SlotState::Unloaded));
            }
        }
        drop(slots);
        if !gone.is_empty() {
            drop(gone);
            self.changed.notify_waiters();
        }
    }

    /// Every model's status and figures.
    pub fn views(&self) -> Vec<View> {
        self.lock()
            .iter()
            .map(|s| {
                let (status, in_flight, idle_secs, kv_bytes, weights_bytes, blocks_used) =
                    match &s.state {
                        SlotState::Unloaded => (Status::Unloaded, 0, None, 0, 0, 0),
                        SlotState::Loading => (Status::Loading, 0, None, 0, 0, 0),
                        SlotState::Failed(e) => (Status::Failed(e.clone()), 0, None, 0, 0, 0),
                        SlotState::Loaded(r) => {
                            let (kv_bytes, blocks_used) = r.served.kv_figures();
                            (
                                Status::Loaded,
                                r.in_flight,
                                Some(r.last_used.elapsed().as_secs_f64()),
                                kv_bytes,
                                s.entry.info.as_ref().map(|i| i.size_bytes).unwrap_or(0),
                                blocks_used,
                            )
                        }
                    };
                View {
                    entry: s.entry.clone(),
                    status,
                    in_flight,
                    idle_secs,
                    kv_bytes,
                    weights_bytes,
                    blocks_used,
                }
            })
            .collect()
    }
}
