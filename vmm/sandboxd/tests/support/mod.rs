//! A real `sandboxd` on a loopback port for the end-to-end tests, and a small
//! HTTP/1.1 client that can also send what well-behaved clients never do.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sandbox_vmm::client::{AgentUrl, Client, ClientError, ConnectOptions};
use sandbox_vmm::node_api::NodeApi;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// How long the daemon may take to say it listens.
const START_WITHIN: Duration = Duration::from_secs(30);

/// A running daemon.
pub struct Daemon {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The operator token.
    pub token: String,
    /// Its home (`SANDBOX_HOME` is the caller's; run folders and the token are here).
    pub dir: PathBuf,
    /// Its log (stderr).
    pub log: PathBuf,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The head, as text.
    pub head: String,
    /// The body as JSON (`Null` when it is not JSON).
    pub json: Value,
    /// The body as text.
    pub text: String,
}

impl Daemon {
    /// Starts `sandboxd ARGS` on a free loopback port with its own run folder,
    /// checkpoint store and token file under `dir`, and `envs` added.
    pub async fn start(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::start_on(dir, "127.0.0.1:0", args, envs).await
    }

    /// [`Daemon::start`] listening on `listen` (a restart on its old port).
    pub async fn start_on(dir: &Path, listen: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        // The relay the launcher starts next to itself, built in this profile.
        sandbox_tests::binaries();
        std::fs::create_dir_all(dir).unwrap();
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        let token_file = dir.join("token");
        let log = dir.join("sandboxd.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
        command
            .args(["--listen", listen, "--token-file"])
            .arg(&token_file)
            .args(args)
            .env("SANDBOX_RUN_DIR", &run)
            .env("SANDBOX_CHECKPOINT_DIR", dir.join("checkpoints"))
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        // The token file is the operator's: made here, mode 0600.
        if !token_file.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&token_file)
                .unwrap();
            std::io::Write::write_all(&mut file, b"operator-token-0123456789abcdef\n").unwrap();
        }
        let token = std::fs::read_to_string(&token_file)
            .unwrap()
            .trim()
            .to_owned();
        let mut child = command.spawn().expect("cannot start sandboxd");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(START_WITHIN, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.strip_prefix("sandboxd listening on ") {
                    return Some(addr.to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            panic!(
                "sandboxd did not start; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        // Keep reading stdout so the daemon never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            addr,
            token,
            dir: dir.to_owned(),
            log,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `METHOD PATH` with `bearer` and a JSON `body`.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let body = body.map(|body| body.to_string());
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        if let Some(bearer) = bearer {
            request.push_str(&format!("Authorization: Bearer {bearer}\r\n"));
        }
        if let Some(body) = &body {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ));
        } else {
            request.push_str("Content-Length: 0\r\n\r\n");
        }
        self.raw(request.as_bytes()).await
    }

    /// The operator's `GET PATH`.
    pub async fn get(&self, path: &str) -> Answer {
        self.call("GET", path, Some(&self.token), None).await
    }

    /// The operator's `POST PATH` with `body`.
    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.call("POST", path, Some(&self.token), Some(body)).await
    }

    /// Sends `bytes` as they are and reads the whole answer.
    pub async fn raw(&self, bytes: &[u8]) -> Answer {
        let mut stream = TcpStream::connect(&self.addr).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(600), stream.read_to_end(&mut answer))
            .await
            .expect("no answer within 600 s")
            .unwrap();
        parse(&answer)
    }

    /// A client of sandbox `id`'s agent through the data plane, with `bearer`: the
    /// workspace's own client, over its `http://` node URL.
    pub async fn agent(&self, id: &str, bearer: &str) -> Result<Client, ClientError> {
        let url = AgentUrl::node(format!("http://{}", self.addr), id);
        let options = ConnectOptions {
            token: Some(bearer.to_owned()),
            ..ConnectOptions::default()
        };
        Client::connect(&url, &options).await
    }

    /// The typed control-plane client, with the operator token.
    pub fn api(&self) -> NodeApi {
        NodeApi::new(&self.addr, Some(self.token.clone())).unwrap()
    }

    /// Waits for the daemon to exit by itself (or by someone else's signal).
    pub async fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().await.unwrap()
    }

    /// `kill -9`, then waits for the exit: nothing of the daemon runs its shutdown.
    pub async fn kill9(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("sandboxd did not die")
            .unwrap()
    }

    /// SIGTERM, then waits for the exit.
    pub async fn terminate(mut self, within: Duration) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("sandboxd did not exit in time")
            .unwrap()
    }
}

/// `sandboxd stop-all` on the home of the daemons started in `dir`; returns its
/// stdout, asserting it succeeded.
pub fn stop_all(dir: &Path) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("stop-all")
        .env("SANDBOX_RUN_DIR", dir.join("run"))
        .env("SANDBOX_CHECKPOINT_DIR", dir.join("checkpoints"))
        .stdin(Stdio::null())
        .output()
        .expect("cannot run sandboxd stop-all");
    assert!(
        output.status.success(),
        "stop-all failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `sandboxd stop-all` on `dir` when dropped: a failed test leaves no VM behind
/// (a daemon's VMs outlive it, by design, so killing the daemon is not enough).
pub struct StopAllOnDrop(pub PathBuf);

impl Drop for StopAllOnDrop {
    fn drop(&mut self) {
        // A daemon dropped just before (killed, not yet gone) may still hold the
        // lock for a moment.
        for _ in 0..5 {
            if !self.0.join("run").exists() {
                return;
            }
            let done = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
                .arg("stop-all")
                .env("SANDBOX_RUN_DIR", self.0.join("run"))
                .env("SANDBOX_CHECKPOINT_DIR", self.0.join("checkpoints"))
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|output| output.status.success());
            if done {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// Parses an HTTP/1.1 answer (with a `Content-Length` or closed-delimited body).
pub fn parse(bytes: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_owned(),
        json: serde_json::from_str(body).unwrap_or(Value::Null),
        text: body.to_owned(),
    }
}

/// A fresh, short private folder (run folders' sockets must fit in 108 bytes).
pub fn test_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/sbxd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
