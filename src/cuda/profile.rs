//! Per-kernel timings on a real GPU, when `EDGE_LLM_CUDA_PROFILE=1`: each launch is bracketed by
//! two timing events, and at each synchronization the GPU time of every launch since the last
//! one is added to its kernel's total, beside the host time the launch call itself took and the
//! host time spent waiting for the GPU. Every 64 synchronizations (about one per engine step)
//! and when the GPU is dropped, the totals are printed to stderr, kernels by GPU time. Off, it
//! costs one branch per launch. Called by `super::device::Gpu`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

#[derive(Default)]
struct Totals {
    /// Per kernel: GPU milliseconds, launches, host microseconds inside the launch call.
    kernels: HashMap<String, (f64, u64, f64)>,
    wait: Duration,
    syncs: u64,
}

/// The profile of one GPU; `None` inside when the variable is not set.
pub struct Profile {
    on: Option<Mutex<(Vec<(String, CudaEvent, CudaEvent)>, Totals)>>,
}

impl Profile {
    pub fn from_env() -> Profile {
        let on = std::env::var("EDGE_LLM_CUDA_PROFILE").is_ok_and(|v| v == "1");
        Profile {
            on: on.then(|| Mutex::new((Vec::new(), Totals::default()))),
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// Runs `launch` between two timing events on `stream` when on.
    pub fn launch<T>(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        name: &str,
        launch: impl FnOnce() -> T,
    ) -> T {
        let Some(m) = &self.on else {
            return launch();
        };
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = match (ctx.new_event(timed), ctx.new_event(timed)) {
            (Ok(s), Ok(e)) => (s, e),
            _ => return launch(),
        };
        let _ = start.record(stream);
        let t = std::time::Instant::now();
        let out = launch();
        let host_us = t.elapsed().as_secs_f64() * 1e6;
        let _ = end.record(stream);
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        g.1.kernels.entry(name.to_string()).or_default().2 += host_us;
        g.0.push((name.to_string(), start, end));
        out
    }

    /// Runs `wait` (a stream synchronization) and adds up the launches it completed.
    pub fn synchronize<T>(&self, wait: impl FnOnce() -> T) -> T {
        let Some(m) = &self.on else {
            return wait();
        };
        let t = std::time::Instant::now();
        let out = wait();
        let waited = t.elapsed();
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        let (pending, totals) = &mut *g;
        totals.wait += waited;
        totals.syncs += 1;
        for (name, start, end) in pending.drain(..) {
            let ms = start.elapsed_ms(&end).unwrap_or(0.0) as f64;
            let k = totals.kernels.entry(name).or_default();
            k.0 += ms;
            k.1 += 1;
        }
        if totals.syncs % 64 == 0 {
            print(totals);
        }
        out
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(m) = &self.on {
            print(&m.lock().unwrap_or_else(|e| e.into_inner()).1);
        }
    }
}

fn print(t: &Totals) {
    let mut rows: Vec<_> = t.kernels.iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    let gpu_ms: f64 = rows.iter().map(|r| r.1 .0).sum();
    let host_ms: f64 = rows.iter().map(|r| r.1 .2).sum::<f64>() / 1e3;
    let launches: u64 = rows.iter().map(|r| r.1 .1).sum();
    eprintln!(
        "cuda profile: {} synchronizations, {launches} launches; GPU {gpu_ms:.1} ms in kernels, host {host_ms:.1} ms in launch calls, {:.1} ms waiting",
        t.syncs,
        t.wait.as_secs_f64() * 1e3
    );
    for (name, (ms, n, host_us)) in rows.iter().take(16) {
        eprintln!(
            "cuda profile:   {name:<40} {n:>7} launches {ms:>9.2} ms GPU ({:>6.1} us each) {:>6.1} us host each",
            ms * 1e3 / (*n).max(1) as f64,
            host_us / (*n).max(1) as f64
        );
    }
}
