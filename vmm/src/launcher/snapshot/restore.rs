//! Starting VMs from a checkpoint: branch, and fork (checkpoint + branch).

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_protocol::{ReidentifyRequest, ResumedRequest};

use super::capture::{Checkpoint, CheckpointSpec};
use super::manifest::{
    Manifest, RamImage, DISK_FILE, INITRAMFS_FILE, KERNEL_FILE, RAM_FILE, STATE_FILE, TOKEN_FILE,
};
use super::{SnapshotError, MAX_BRANCH};
use crate::client::{AgentUrl, Client, ClientError, ConnectOptions};
use crate::launcher::accel::AccelDecision;
use crate::launcher::boot::Launcher;
use crate::launcher::run_dir::{self, VmId};
use crate::launcher::start::{Incoming, IncomingRam, Start};
use crate::launcher::vm::Vm;
use crate::launcher::DEFAULT_READY_TIMEOUT_SECS;

/// Bytes of fresh entropy each restored guest gets.
const ENTROPY_BYTES: usize = 64;

/// How long a restored agent may take to take its new identity, all told.
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a restored agent may take to accept the identity connection.
const IDENTITY_CONNECT: Duration = Duration::from_secs(30);

/// How children are started.
#[derive(Debug, Clone)]
pub struct BranchSpec {
    /// Let the children outlive this process (`vm branch`, `vm fork`).
    pub detached: bool,
    /// How long each child's agent may take to attach after its QEMU starts.
    pub ready_timeout: Duration,
}

impl Default for BranchSpec {
    fn default() -> Self {
        Self {
            detached: false,
            ready_timeout: Duration::from_secs(DEFAULT_READY_TIMEOUT_SECS),
        }
    }
}

/// A fork's result.
#[derive(Debug)]
pub struct Fork {
    /// The checkpoint the children were made from (ephemeral: removed once none of
    /// them runs).
    pub checkpoint: Checkpoint,
    /// The children, each answering.
    pub children: Vec<Vm>,
    /// From the call to the last child answering.
    pub total: Duration,
}

impl Launcher {
    /// Every checkpoint, oldest first, with who uses it.
    pub fn checkpoints(&self) -> Result<Vec<super::CheckpointInfo>, SnapshotError> {
        self.sweep_checkpoints_once();
        self.checkpoint_store().list()
    }

    /// Deletes a checkpoint by id or name. One that a live VM maps, or that another
    /// checkpoint's disk is based on, is refused with [`SnapshotError::InUse`].
    pub fn delete_checkpoint(&self, key: &str) -> Result<Manifest, SnapshotError> {
        self.checkpoint_store().delete(key)
    }

    /// Starts `count` children of the checkpoint `key` (id or name), all at once. All
    /// or nothing: when one fails, the others are stopped and the error names it.
    pub async fn branch(
        &self,
        key: &str,
        count: usize,
        spec: BranchSpec,
    ) -> Result<Vec<Vm>, SnapshotError> {
        if count == 0 || count > MAX_BRANCH {
            return Err(SnapshotError::Count(count));
        }
        if let Err(error) = self.sweep() {
            tracing::warn!(%error, "sweep of stale run folders failed");
        }
        let info = self.checkpoint_store().find(key)?;
        let manifest = self.flatten_checkpoint(&info.path, info.manifest).await?;
        let start = self.restore_start(&info.path, &manifest, &spec)?;
        let started =
            futures::future::join_all((0..count).map(|_| self.start_child(start.clone()))).await;
        let mut children = Vec::with_capacity(count);
        let mut failure = None;
        for (index, result) in started.into_iter().enumerate() {
            match result {
                Ok(vm) => children.push(vm),
                Err(error) if failure.is_none() => failure = Some((index, error)),
                Err(_) => {}
            }
        }
        if let Some((index, error)) = failure {
            // Dropping a Vm stops its QEMU and relay and removes its run folder.
            drop(children);
            return Err(error.into_snapshot_error(index + 1, count));
        }
        Ok(children)
    }

    /// Checkpoints `id` and starts `count` children of it: all or nothing (a failed
    /// fork leaves no child and no checkpoint). The checkpoint is ephemeral.
    pub async fn fork(
        &self,
        id: &VmId,
        count: usize,
        spec: BranchSpec,
    ) -> Result<Fork, SnapshotError> {
        if count == 0 || count > MAX_BRANCH {
            return Err(SnapshotError::Count(count));
        }
        let started = Instant::now();
        // Paused, whatever the RAM in use: the children wait for the whole capture,
        // and a paused one is the shortest call (measured with 256 MiB dirtied under
        // TCG: 0.29 s, against 2.7 s live, for a 225 ms pause against 13 ms).
        let checkpoint = self
            .checkpoint(
                id,
                CheckpointSpec {
                    name: None,
                    ephemeral: true,
                    method: super::CaptureMethod::Paused,
                    incremental: false,
                },
            )
            .await?;
        match self.branch(&checkpoint.manifest.id, count, spec).await {
            Ok(children) => Ok(Fork {
                checkpoint,
                children,
                total: started.elapsed(),
            }),
            Err(error) => {
                if let Err(cleanup) = self.delete_checkpoint(&checkpoint.manifest.id) {
                    tracing::warn!(error = %cleanup, "cannot remove the failed fork's checkpoint");
                }
                Err(error)
            }
        }
    }

    /// The checkpoint in `folder` with a full RAM image: an incremental one is
    /// flattened first, once (see `diff`); others are returned as they are.
    pub async fn flatten_checkpoint(
        &self,
        folder: &Path,
        manifest: Manifest,
    ) -> Result<Manifest, SnapshotError> {
        if manifest.ram != RamImage::Diff {
            return Ok(manifest);
        }
        let root = self.config.checkpoint_root.clone();
        let folder = folder.to_owned();
        tokio::task::spawn_blocking(move || super::diff::flatten(&root, &folder))
            .await
            .map_err(|error| SnapshotError::Write {
                path: self.config.checkpoint_root.clone(),
                error: std::io::Error::other(error),
            })?
    }

    /// What every child of a checkpoint starts from; checks the files are there.
    pub(crate) fn restore_start(
        &self,
        folder: &Path,
        manifest: &Manifest,
        spec: &BranchSpec,
    ) -> Result<Start, SnapshotError> {
        let damaged = |why: String| SnapshotError::Damaged {
            id: manifest.id.clone(),
            why,
        };
        let need = |name: &str| {
            let path = folder.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(damaged(format!("{name} is missing")))
            }
        };
        if let Some(here) = self.qemu_version() {
            if here != manifest.qemu_version {
                return Err(damaged(format!(
                    "it was made by QEMU {} and this is QEMU {here}: QEMU restores only its own version's state",
                    manifest.qemu_version
                )));
            }
        }
        let state = need(STATE_FILE)?;
        let ram = match manifest.ram {
            RamImage::File => IncomingRam::Map(need(RAM_FILE)?),
            RamImage::InStream => IncomingRam::Stream,
            RamImage::Diff => {
                return Err(damaged(
                    "its RAM is an incremental image that was not flattened".into(),
                ))
            }
        };
        let disk_base = match manifest.machine.disk {
            true => Some(need(DISK_FILE)?),
            false => None,
        };
        let mut machine = manifest.machine.clone();
        machine.kernel = need(KERNEL_FILE)?;
        if machine.initramfs.is_some() {
            machine.initramfs = Some(need(INITRAMFS_FILE)?);
        }
        let token = std::fs::read_to_string(need(TOKEN_FILE)?)
            .map_err(|e| damaged(format!("cannot read its token: {e}")))?
            .trim()
            .to_owned();
        Ok(Start {
            accel: AccelDecision {
                accel: machine.accel,
                reason: format!("restored from checkpoint {}", manifest.id),
            },
            machine,
            disk_base,
            persistent_disk: None,
            // Children have the network the checkpointed VM had.
            egress: crate::egress::read_policy(&folder.join(crate::egress::POLICY_FILE))
                .map_err(|e| damaged(format!("its egress policy: {}", crate::error_chain(&e))))?,
            incoming: Some(Incoming { state, ram }),
            token,
            checkpoint: Some(manifest.id.clone()),
            restored_from: Some(manifest.id.clone()),
            reuse: None,
            detached: spec.detached,
            ready_timeout: spec.ready_timeout,
        })
    }

    /// This host's QEMU version (`major.minor.micro`, from `--version`, asked once);
    /// `None` when it cannot be told (the restore then finds out).
    pub(crate) fn qemu_version(&self) -> Option<String> {
        self.qemu_version
            .get_or_init(|| {
                let output = std::process::Command::new(&self.config.qemu_path)
                    .arg("--version")
                    .stdin(std::process::Stdio::null())
                    .output()
                    .ok()?;
                parse_qemu_version(&String::from_utf8_lossy(&output.stdout))
            })
            .clone()
    }

    /// One child: started, then given its own identity and token.
    pub(crate) async fn start_child(&self, start: Start) -> Result<Vm, ChildError> {
        let mut vm = self.start_machine(start).await.map_err(ChildError::Start)?;
        let token = run_dir::generate_token()
            .map_err(|e| ChildError::Start(crate::launcher::LaunchError::Token(e)))?;
        let hostname = format!("sandbox-{}", vm.id());
        let identify = async {
            let began = std::time::Instant::now();
            let client = connect(&vm.url(), vm.token()).await?;
            let connected = began.elapsed();
            // Both at once (the agent serves requests concurrently): a guest just
            // restored is slow, and each round trip through it costs tens of ms.
            let first = resumed_now(true);
            let reidentify = ReidentifyRequest {
                hostname: Some(hostname),
                token: Some(token.clone()),
            };
            let (resumed, reidentified) = tokio::join!(
                client.resumed(first.wall_clock_ns, first.entropy, true),
                client.reidentify(reidentify)
            );
            resumed?;
            reidentified?;
            let identified = began.elapsed();
            // Then the clock once more, over a warm path (see `resume`).
            let settled = settle_clock(&client).await;
            tracing::debug!(
                connect_ms = connected.as_millis(),
                identity_ms = (identified - connected).as_millis(),
                clock_ms = (began.elapsed() - identified).as_millis(),
                "child identified"
            );
            settled
        };
        let Ok(identified) = tokio::time::timeout(IDENTITY_TIMEOUT, identify).await else {
            return Err(ChildError::Identity(SnapshotError::IdentityTimeout {
                id: vm.id().to_string(),
                after: IDENTITY_TIMEOUT,
            }));
        };
        if let Err(error) = identified {
            return Err(ChildError::Identity(SnapshotError::Identity {
                id: vm.id().to_string(),
                error,
            }));
        }
        vm.set_token(token).map_err(ChildError::Start)?;
        Ok(vm)
    }
}

/// `7.2.22` from `QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18)`.
pub fn parse_qemu_version(text: &str) -> Option<String> {
    let rest = text.split("version ").nth(1)?;
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (version.split('.').count() == 3).then_some(version)
}

/// How one child failed.
pub(crate) enum ChildError {
    Start(crate::launcher::LaunchError),
    Identity(SnapshotError),
}

impl ChildError {
    /// The error of child `index` (from 1) of `count`.
    pub(crate) fn into_snapshot_error(self, index: usize, count: usize) -> SnapshotError {
        match self {
            Self::Start(error) => SnapshotError::Child {
                index,
                count,
                error: Box::new(error),
            },
            Self::Identity(error) => error,
        }
    }
}

/// Sends `resumed`: the host's time now and fresh entropy; then the time again
/// until it arrives fast (see [`settle_clock`]).
async fn resume(client: &Client, new_identity: bool) -> Result<(), ClientError> {
    let request = resumed_now(new_identity);
    client
        .resumed(request.wall_clock_ns, request.entropy, request.new_identity)
        .await?;
    settle_clock(client).await
}

/// A clock setting whose round trip took at most this long is off by less.
const CLOCK_ROUND_TRIP_GOAL: std::time::Duration = std::time::Duration::from_millis(30);

/// Settings of the clock [`settle_clock`] tries at most.
const CLOCK_ATTEMPTS: usize = 5;

/// Sets a restored guest's clock again until one setting's round trip takes at most
/// [`CLOCK_ROUND_TRIP_GOAL`] (or [`CLOCK_ATTEMPTS`] were made). The guest sets the
/// time the host sent when the request arrives, so it lags by the request's transit,
/// which the round trip bounds. A guest just restored runs slowly at first (under
/// TCG every code path is translated again), and a loaded host delays it more: a
/// single resend was seen still 300 ms behind on a busy machine.
async fn settle_clock(client: &Client) -> Result<(), ClientError> {
    for _ in 0..CLOCK_ATTEMPTS {
        let sent = std::time::Instant::now();
        // No entropy: the clock only (the guest's random state was renewed by the
        // first `resumed`, and an answer that waits for sessions to reseed would
        // hide how fast the time arrived).
        client
            .resumed(resumed_now(false).wall_clock_ns, Vec::new(), false)
            .await?;
        tracing::debug!(
            round_trip_ms = sent.elapsed().as_millis(),
            "clock set again"
        );
        if sent.elapsed() <= CLOCK_ROUND_TRIP_GOAL {
            break;
        }
    }
    Ok(())
}

/// `resumed` with the host's time now and fresh entropy.
pub(crate) fn resumed_now(new_identity: bool) -> ResumedRequest {
    let wall_clock_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut entropy = vec![0u8; ENTROPY_BYTES];
    if let Err(error) = run_dir::random_bytes(&mut entropy) {
        // The guest's kernel still reseeds (RDRAND, its own pool); say so.
        tracing::warn!(%error, "no host entropy for a restored guest");
    }
    ResumedRequest {
        wall_clock_ns,
        entropy,
        new_identity,
    }
}

async fn connect(url: &AgentUrl, token: &str) -> Result<Client, ClientError> {
    let options = ConnectOptions {
        token: Some(token.to_owned()),
        ..ConnectOptions::default()
    };
    let deadline = tokio::time::Instant::now() + IDENTITY_CONNECT;
    Client::connect_with_retry(url, &options, deadline).await
}

/// Sets a restored VM's wall clock from the host's (no new identity).
pub(crate) async fn fix_clock_of(vm: &Vm) -> Result<(), ClientError> {
    let client = connect(&vm.url(), vm.token()).await?;
    resume(&client, false).await
}

/// Sets a running agent's wall clock from the host's (after its VM was paused).
pub(crate) async fn fix_clock(socket: &Path, token: &str) -> Result<(), ClientError> {
    let client = connect(&AgentUrl::Unix(socket.to_owned()), token).await?;
    resume(&client, false).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_versions_are_read_from_version_output() {
        assert_eq!(
            parse_qemu_version(
                "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright"
            ),
            Some("7.2.22".into())
        );
        assert_eq!(
            parse_qemu_version("QEMU emulator version 10.0.2\n"),
            Some("10.0.2".into())
        );
        assert_eq!(parse_qemu_version("something else"), None);
    }
}
