//! [`NodeDaemon`]: a real `sandboxd` on a loopback port, attached to one agent
//! (`--attach`), for the suite's `upgrade` transport. Every connection of the
//! transport is then the daemon's own data plane: its router, its token check, its
//! splice that gives the agent its own token.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sandbox_vmm::client::AgentUrl;

use crate::bins::binaries;
use crate::TempDir;

/// The id `sandboxd --attach` gives the one agent it serves.
pub const ATTACHED: &str = "attached";

/// How long the daemon may take to say it listens.
const START_WITHIN: Duration = Duration::from_secs(60);

/// A `sandboxd --attach URL` process; killed when dropped.
#[derive(Debug)]
pub struct NodeDaemon {
    child: Child,
    base: String,
    token: String,
    log: std::path::PathBuf,
    _dir: TempDir,
}

impl NodeDaemon {
    /// Starts a daemon in front of the agent at `agent`, which requires `agent_token`.
    pub fn attached(agent: &AgentUrl, agent_token: &str) -> Self {
        let dir = TempDir::new("sandboxd");
        let token = format!("suite-operator-token-{}", std::process::id());
        let token_file = dir.path().join("token");
        let agent_token_file = dir.path().join("agent-token");
        for (file, secret) in [
            (&token_file, token.as_str()),
            (&agent_token_file, agent_token),
        ] {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .expect("cannot write a token file");
            std::io::Write::write_all(&mut out, secret.as_bytes()).expect("cannot write a token");
        }
        let log = dir.path().join("sandboxd.log");
        let mut child = Command::new(&binaries().sandboxd)
            .args(["--listen", "127.0.0.1:0", "--token-file"])
            .arg(&token_file)
            .arg("--attach")
            .arg(agent.to_string())
            .arg("--attach-token-file")
            .arg(&agent_token_file)
            .arg("--sandbox-home")
            .arg(dir.path().join("home"))
            .env("SANDBOX_LOG", "sandboxd=debug,sandbox_vmm=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("cannot create the daemon's log"))
            .spawn()
            .expect("cannot start sandboxd");
        let stdout = child.stdout.take().expect("no stdout pipe");
        let (sender, listening) = mpsc::channel();
        // Reads the one line that says where it listens, then drains the pipe so the
        // daemon never blocks on it.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("sandboxd listening on ") {
                    let _ = sender.send(addr.to_owned());
                }
            }
        });
        let Ok(addr) = listening.recv_timeout(START_WITHIN) else {
            let _ = child.kill();
            panic!(
                "sandboxd did not start; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Self {
            child,
            base: format!("http://{addr}"),
            token,
            log,
            _dir: dir,
        }
    }

    /// The data plane of the attached agent.
    pub fn agent_url(&self) -> AgentUrl {
        AgentUrl::node(self.base.clone(), ATTACHED)
    }

    /// The operator token clients present.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The end of the daemon's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
