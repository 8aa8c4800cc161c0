//! [`Screen`]: a terminal's output collected in the background, for pty tests on
//! Unix sockets and in microVMs alike.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_protocol::{ExitStatus, Pid, Stream};
use sandbox_vmm::client::{Client, LogsEvent};

/// How long [`Screen::wait_for`] waits for text to appear.
const WAIT_SECS: u64 = 20;

/// A followed terminal: every output chunk from a cursor on, in order.
#[derive(Debug)]
pub struct Screen {
    /// The bytes shown so far.
    pub text: Arc<Mutex<Vec<u8>>>,
    /// Ends with the terminal's exit status once its process is gone.
    pub task: tokio::task::JoinHandle<Option<ExitStatus>>,
}

impl Screen {
    /// Follows terminal `pid` from byte `cursor`; every chunk must be terminal output.
    pub fn follow(client: &Client, pid: Pid, cursor: u64) -> Self {
        let text = Arc::new(Mutex::new(Vec::new()));
        let mut stream = client
            .logs_follow(pid, Some(cursor))
            .expect("cannot follow the terminal");
        let sink = text.clone();
        let task = tokio::spawn(async move {
            loop {
                let (chunks, exit, done) = match stream.next().await.expect("follow failed") {
                    LogsEvent::Batch(batch) => (batch.chunks, None, false),
                    LogsEvent::Finished(reply) => (reply.batch.chunks, reply.exit, true),
                };
                for chunk in chunks {
                    assert_eq!(chunk.stream, Stream::Pty);
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .extend_from_slice(&chunk.data);
                }
                if done {
                    return exit;
                }
            }
        });
        Self { text, task }
    }

    /// Everything shown so far, as text.
    pub fn contents(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap_or_else(PoisonError::into_inner))
            .into_owned()
    }

    /// Waits until the terminal has shown `needle`; panics with the screen if not.
    pub async fn wait_for(&self, needle: &str) {
        let found = tokio::time::timeout(Duration::from_secs(WAIT_SECS), async {
            while !self.contents().contains(needle) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            found.is_ok(),
            "terminal never showed {needle:?}; it shows:\n{}",
            self.contents()
        );
    }
}
