//! `serve --kv-events tcp://HOST:PORT`: publishes the engine's KV cache events
//! (`crate::engine::kv_events`) the way vLLM does, so prefix-aware routers (vllm-router's
//! `kv_aware`, llm-d's precise prefix scorer) know which worker holds which prefix.
//!
//! - A ZMQ PUB socket bound at the endpoint; each message has three frames: the topic (empty
//!   by default), an 8-byte big-endian sequence number (0 at start, +1 per message; a lower
//!   number tells subscribers the worker restarted) and the msgpack payload (`wire`).
//! - The first message is `AllBlocksCleared`.
//! - Optionally (`--kv-events-replay`) a ROUTER socket that answers `[id, "", start_seq]` with
//!   every buffered message from `start_seq` on as `[id, "", seq, payload]`, then
//!   `[id, "", -1, ""]`, for a subscriber that missed some.
//!
//! Runs on its own thread (a one-thread tokio runtime). The engine hands it batches through a
//! bounded queue and never waits: a full queue drops the batch, and PUB drops messages for a
//! subscriber that reads too slowly; both count in `edge_llm_kv_events_dropped_total`.

pub mod wire;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::engine::kv_events::{KvCacheEvent, KvEventSink, KV_EVENT_QUEUE_BATCHES};

/// Messages kept for replay.
pub const REPLAY_BUFFER_MESSAGES: usize = 10_000;

/// Where and how to publish.
#[derive(Clone, Debug)]
pub struct KvEventsConfig {
    /// `tcp://HOST:PORT` for the PUB socket.
    pub endpoint: String,
    /// `tcp://HOST:PORT` for the replay ROUTER socket, if any.
    pub replay_endpoint: Option<String>,
    /// The first frame of every message.
    pub topic: String,
    /// Tokens per block (goes into every `BlockStored`).
    pub block_size: usize,
    /// Whether `BlockStored` carries its blocks' token ids (else an empty list: the hashes,
    /// salted per API key, still name the blocks).
    pub token_ids: bool,
}

/// A running publisher: the engine's sink, and what the metrics show.
pub struct KvEventPublisher {
    pub sink: KvEventSink,
    /// The endpoints actually bound (a port 0 resolved).
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    /// Messages published.
    published: Arc<AtomicU64>,
}

impl KvEventPublisher {
    pub fn num_published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    pub fn num_dropped(&self) -> u64 {
        self.sink.num_dropped()
    }
}

/// Checks an endpoint: `tcp://HOST:PORT` with an IP address (or `localhost`) and a port.
/// A bare `PORT` means `tcp://127.0.0.1:PORT`.
pub fn parse_endpoint(flag: &str, text: &str) -> Result<String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(format!("tcp://127.0.0.1:{port}"));
    }
    let rest = text.strip_prefix("tcp://").ok_or_else(|| {
        anyhow!("{flag} must be tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557), got `{text}`")
    })?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("{flag} `{text}` has no port (tcp://HOST:PORT)"))?;
    port.parse::<u16>()
        .map_err(|_| anyhow!("{flag} `{text}`: `{port}` is not a port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if host == "localhost" {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| {
            anyhow!("{flag} `{text}`: `{host}` is not an IP address (use 127.0.0.1 or 0.0.0.0)")
        })?
    };
    Ok(match ip {
        IpAddr::V4(ip) => format!("tcp://{ip}:{port}"),
        IpAddr::V6(ip) => format!("tcp://[{ip}]:{port}"),
    })
}

/// Binds the sockets (errors such as a port in use come back here) and starts the thread.
pub fn start(config: KvEventsConfig) -> Result<KvEventPublisher> {
    let endpoint = parse_endpoint("--kv-events", &config.endpoint)?;
    let replay = match &config.replay_endpoint {
        Some(r) => Some(parse_endpoint("--kv-events-replay", r)?),
        None => None,
    };
    let (sink, rx) = KvEventSink::new(KV_EVENT_QUEUE_BATCHES);
    let published = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = Publisher {
        rx,
        sink: sink.clone(),
        topic: Bytes::from(config.topic.clone().into_bytes()),
        block_size: config.block_size,
        token_ids: config.token_ids,
        published: published.clone(),
        next_seq: 0,
        buffer: VecDeque::new(),
    };
    std::thread::Builder::new()
        .name("edge-llm-kv-events".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!(e).context("starting the KV event thread")));
                    return;
                }
            };
            runtime.block_on(thread.run(endpoint, replay, ready_tx));
        })
        .context("starting the KV event thread")?;
    let (endpoint, replay_endpoint) = ready_rx
        .recv()
        .context("the KV event thread ended before binding")??;
    Ok(KvEventPublisher {
        sink,
        endpoint,
        replay_endpoint,
        published,
    })
}

type Ready = std::sync::mpsc::Sender<Result<(String, Option<String>)>>;

/// Empties the token ids of every `BlockStored` (`--kv-events-token-ids off`).
fn without_token_ids(events: &mut [KvCacheEvent]) {
    for e in events {
        if let KvCacheEvent::BlockStored { token_ids, .. } = e {
            token_ids.clear();
        }
    }
}

struct Publisher {
    rx: tokio::sync::mpsc::Receiver<Vec<KvCacheEvent>>,
    sink: KvEventSink,
    topic: Bytes,
    block_size: usize,
    token_ids: bool,
    published: Arc<AtomicU64>,
    next_seq: u64,
    /// The most recent messages, for replay: (sequence number, payload).
    buffer: VecDeque<(u64, Bytes)>,
}

impl Publisher {
    async fn run(mut self, endpoint: String, replay: Option<String>, ready: Ready) {
        let mut publisher = zeromq::PubSocket::new();
        let bound = match publisher.bind(&endpoint).await {
            Ok(e) => e.to_string(),
            Err(e) => {
                let _ = ready.send(Err(anyhow!("binding --kv-events {endpoint}: {e}")));
                return;
            }
        };
        let mut router = None;
        let mut replay_bound = None;
        if let Some(r) = replay {
            let mut socket = zeromq::RouterSocket::new();
            match socket.bind(&r).await {
                Ok(e) => replay_bound = Some(e.to_string()),
                Err(e) => {
                    let _ = ready.send(Err(anyhow!("binding --kv-events-replay {r}: {e}")));
                    return;
                }
            }
            router = Some(socket);
        }
        if ready.send(Ok((bound, replay_bound))).is_err() {
            return;
        }
        loop {
            tokio::select! {
                batch = self.rx.recv() => match batch {
                    Some(mut events) => {
                        if !self.token_ids {
                            without_token_ids(&mut events);
                        }
                        self.publish(&mut publisher, &events).await
                    }
                    None => return, // the engine stopped
                },
                request = recv_or_wait(&mut router) => {
                    if let (Ok(request), Some(socket)) = (request, router.as_mut()) {
                        self.replay(socket, request).await;
                    }
                }
            }
        }
    }

    async fn publish(&mut self, socket: &mut zeromq::PubSocket, events: &[KvCacheEvent]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let payload = Bytes::from(wire::encode_batch(now, events, self.block_size));
        let mut message = ZmqMessage::from(self.topic.clone());
        message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        message.push_back(payload.clone());
        // PUB never waits for a subscriber: a slow one loses the message (counted).
        if socket.send(message).await.is_err() {
            self.sink.count_dropped(1);
        }
        self.published.fetch_add(1, Ordering::Relaxed);
        if self.buffer.len() == REPLAY_BUFFER_MESSAGES {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload));
    }

    /// Answers one replay request `[id, "", start_seq]`; a malformed one is ignored.
    async fn replay(&mut self, socket: &mut zeromq::RouterSocket, request: ZmqMessage) {
        let frames: Vec<Bytes> = request.into_vec();
        let (Some(id), Some(start)) = (frames.first(), frames.last()) else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(&start[..]) else {
            return;
        };
        let start = u64::from_be_bytes(start);
        let reply = |seq: Bytes, payload: Bytes| {
            let mut m = ZmqMessage::from(id.clone());
            m.push_back(Bytes::new());
            m.push_back(seq);
            m.push_back(payload);
            m
        };
        let wanted: Vec<(u64, Bytes)> = self
            .buffer
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        for (seq, payload) in wanted {
            let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
            if socket.send(reply(seq, payload)).await.is_err() {
                return;
            }
        }
        let end = Bytes::copy_from_slice(&(-1i64).to_be_bytes());
        let _ = socket.send(reply(end, Bytes::new())).await;
    }
}

/// The next replay request, or never when there is no replay socket.
async fn recv_or_wait(router: &mut Option<zeromq::RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match router {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        let p = |t: &str| parse_endpoint("--kv-events", t);
        assert_eq!(p("5557").unwrap(), "tcp://127.0.0.1:5557");
        assert_eq!(p("tcp://127.0.0.1:5557").unwrap(), "tcp://127.0.0.1:5557");
        assert_eq!(p("tcp://localhost:1").unwrap(), "tcp://127.0.0.1:1");
        assert_eq!(p("tcp://0.0.0.0:9").unwrap(), "tcp://0.0.0.0:9");
        assert_eq!(p("tcp://[::1]:9").unwrap(), "tcp://[::1]:9");
        for bad in [
            "",
            "udp://1.2.3.4:5",
            "tcp://1.2.3.4",
            "tcp://1.2.3.4:x",
            "tcp://host:5",
            "70000",
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.contains("--kv-events"), "{bad}: {e}");
        }
    }
}
