//! The planner pool: the CPU work of a request before the engine sees it (reading the JSON body,
//! rendering the chat template, tokenizing, compiling a grammar) runs here, on a few blocking
//! threads, never on the HTTP runtime's two threads. A megabyte prompt takes seconds to tokenize
//! and a large schema as long to compile; run inline they held the HTTP threads, so `/health`
//! and every other client's token stream waited behind them (issue 30).
//!
//! At most `num_threads` jobs run at once; at most `max_planning` requests wait for or run in
//! planning (`--max-planning`), and one more is answered 503 with `Retry-After`. Called by the
//! handlers in `routes`, `router_api` and `cache_routes`.

use std::sync::Arc;

use axum::http::StatusCode;
use tokio::sync::Semaphore;

use super::error::ApiError;

/// Planner threads: planning is CPU-bound, and the engine loop needs the cores more.
pub const NUM_PLANNER_THREADS: usize = 2;

/// The admission limit and the threads of the pool.
pub struct Planner {
    /// Requests waiting for or in planning, up to `max_planning`.
    admitted: Arc<Semaphore>,
    /// Jobs running on a blocking thread, up to `num_threads`.
    running: Arc<Semaphore>,
    max_planning: usize,
}

impl Planner {
    pub fn new(max_planning: usize, num_threads: usize) -> Planner {
        Planner {
            admitted: Arc::new(Semaphore::new(max_planning)),
            running: Arc::new(Semaphore::new(num_threads)),
            max_planning,
        }
    }

    /// Runs `job` on a planner thread and answers what it returns; 503 at once when
    /// `max_planning` requests are already waiting or planning. A job whose client goes away
    /// before it starts is dropped; one already running finishes and keeps its slot till then.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let admitted = self.admitted.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!(
                    "the server is busy: {} requests are already being planned (--max-planning); retry later",
                    self.max_planning
                ),
            )
            .with_code("planning_queue_full")
            .with_retry_after(1)
        })?;
        let running = self
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the planner pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _slots = (admitted, running);
            job()
        })
        .await
        .map_err(|e| ApiError::internal(format!("planning the request failed: {e}")))?
    }
}
