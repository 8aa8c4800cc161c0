//! The agent's request dispatcher, in-process, against a scratch directory.
//!
//! The input is a script: postcard `Request` bodies back to back, a `put`'s data as a
//! postcard byte vector right after it. Requests that would run programs, power off
//! or set the clock are skipped; every path is confined to a fresh scratch directory
//! (see `sandbox_fuzz::scratch`). Invariant: each request ends with a reply or a
//! typed error, never a panic.

#![no_main]

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sandbox_agent::agent::Agent;
use sandbox_agent::events::Events;
use sandbox_agent::files::stream::put_channel;
use sandbox_agent::server::dispatch;
use sandbox_fuzz::scratch::confine_request;
use sandbox_protocol::{ErrorKind, Request, RequestId};
use tokio::sync::{mpsc, watch};

/// Requests per input, at most: enough for mkdir, write, list, rename, remove.
const MAX_REQUESTS: usize = 16;

/// How long one request may take: file requests on a tmpfs-sized scratch directory
/// finish in microseconds, so running into this is a hang.
const REQUEST_DEADLINE_SECS: u64 = 10;

/// One runtime for the whole run: building one per input would dominate the cost.
/// Current-thread, like the agent's own (see its `main.rs`).
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the fuzzer's runtime")
});

static AGENT: LazyLock<Agent> = LazyLock::new(|| Agent::new(Duration::from_secs(60), None, false));

/// The scratch directory of this fuzzer process; emptied before each input.
static SCRATCH: LazyLock<PathBuf> = LazyLock::new(|| {
    let dir = std::env::temp_dir().join(format!("sandbox-fuzz-dispatch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
});

fuzz_target!(|data: &[u8]| {
    let root = SCRATCH.as_path();
    // The last input may have removed the directory and written a file in its place.
    // (Root can remove whatever it made read-only.)
    let _ = std::fs::remove_dir_all(root).or_else(|_| std::fs::remove_file(root));
    std::fs::create_dir_all(root).expect("recreating the scratch directory");
    let mut rest = data;
    for _ in 0..MAX_REQUESTS {
        let Ok((request, after)) = postcard::take_from_bytes::<Request>(rest) else {
            break;
        };
        rest = after;
        let put_data = if matches!(request, Request::Put(_)) {
            match postcard::take_from_bytes::<Vec<u8>>(rest) {
                Ok((data, after)) => {
                    rest = after;
                    Some(data)
                }
                Err(_) => None,
            }
        } else {
            None
        };
        let Some(request) = confine_request(root, request) else {
            continue;
        };
        RUNTIME.block_on(run(request, put_data));
    }
});

/// Runs one request to its final answer, draining its events as a connection would.
async fn run(request: Request, put_data: Option<Vec<u8>>) {
    let name = request.name();
    let (tx, mut rx) = mpsc::channel(8);
    // No stream window: the events are drained at once, as fast as they come.
    let (_report, consumed) = watch::channel(0);
    let events = Events::new(
        RequestId(1),
        tx,
        AGENT.budget.clone(),
        consumed,
        Arc::new(AtomicBool::new(false)),
    );
    let input = if matches!(request, Request::Put(_)) {
        let (sender, receiver) = put_channel();
        // With no data the put sees its queue close: an incomplete transfer.
        if let Some(data) = put_data {
            sender.data(data, sandbox_agent::budget::Charge::none());
            sender.end();
        }
        Some(receiver)
    } else {
        None
    };
    let handle = async {
        let result = dispatch::handle(&AGENT, request, &events, input).await;
        drop(events);
        result
    };
    let drain = async { while rx.recv().await.is_some() {} };
    let deadline = Duration::from_secs(REQUEST_DEADLINE_SECS);
    let (result, ()) = tokio::time::timeout(deadline, async { tokio::join!(handle, drain) })
        .await
        .unwrap_or_else(|_| panic!("{name} did not finish in {deadline:?}"));
    if let Err(error) = result {
        // A file request failing with `Internal` means the agent hit something it did
        // not expect (a panicking blocking task is reported that way too).
        assert!(
            !(error.kind == ErrorKind::Internal && error.message.contains("panicked")),
            "{name}: {error}"
        );
        let _ = error.to_string();
    }
}
