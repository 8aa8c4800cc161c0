//! The QMP commands snapshots use, as typed methods on [`Qmp`].
//!
//! # Save and restore, as measured on QEMU 7.2 (TCG, Debian 12)
//! - `migrate file:` does not exist before QEMU 8.0. `exec:cat > FILE` works but
//!   forks the whole QEMU and runs a shell and `cat` (about 3 ms of a restore on
//!   2 cores); an open file handed over with `getfd` (`SCM_RIGHTS`) and named in
//!   `fd:NAME` is read or written by QEMU itself ([`Qmp::migrate_to_file`],
//!   [`Qmp::migrate_incoming_from_file`]).
//! - The default `max-bandwidth` (128 MiB/s) throttles a save to a file: raise it
//!   ([`Qmp::set_max_bandwidth`]) first.
//! - With guest RAM as `-object memory-backend-file,…,share=on` (on a tmpfs) and
//!   `-M microvm,memory-backend=mem`, the `x-ignore-shared` capability on **both**
//!   sides keeps RAM out of the stream: a 64 MiB guest saves about 52 KB of device
//!   state in about 5 ms. The destination must map the same RAM contents; a
//!   capability set on only one side makes the destination exit on load.
//! - A destination is started with `-incoming defer`; it takes
//!   `migrate-set-capabilities`, then `migrate-incoming`. It stays in `inmigrate`
//!   until the stream is loaded, then takes the run state the source had when it
//!   migrated: `paused` after a `stop`ped source (the usual save: the caller then
//!   issues [`Qmp::cont`]), `running` after a running one, `prelaunch` after a source
//!   that never ran (`-S`). A destination started with `-S` ends `paused` whatever the
//!   source was.
//! - A destination whose stream is not a migration stream exits ("load of migration
//!   failed"): [`QmpError::Closed`]. One whose stream is *empty* (`exec:cat` of a
//!   missing file, or an empty file) stays in `inmigrate` for good with an empty `query-migrate`: only
//!   [`Qmp::wait_incoming`]'s timeout ends that wait, so check the file first.
//! - A source ends in `postmigrate` once the migration completes.

use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Deadline, Qmp, QmpError};

/// How often [`Qmp::wait_migration`] and [`Qmp::wait_incoming`] poll. A state-only
/// save takes about 5 ms, so a coarser poll would dominate it.
pub const MIGRATION_POLL: Duration = Duration::from_millis(2);

/// The name a migration's file descriptor is handed to QEMU under (`getfd`).
const MIGRATION_FD_NAME: &str = "sandbox-migration";

/// Defines a string enum of QEMU's with a catch-all for strings a newer QEMU adds.
macro_rules! qemu_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
        #[serde(from = "String")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A value this client does not know, as QEMU spelled it.
            Other(String),
        }

        impl $name {
            /// QEMU's spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)*
                    Self::Other(text) => text,
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match text.as_str() {
                    $($text => Self::$variant,)*
                    _ => Self::Other(text),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

qemu_enum! {
    /// A VM's run state (`query-status`), QEMU 7.2's `RunState`.
    RunState {
        /// Stopped by the debugger (gdbstub).
        Debug = "debug",
        /// Waiting for, or loading, an incoming migration.
        Inmigrate = "inmigrate",
        /// Stopped by an internal error (a KVM emulation failure, …).
        InternalError = "internal-error",
        /// Stopped on a disk I/O error.
        IoError = "io-error",
        /// Stopped (`stop`, or a migration from a stopped source).
        Paused = "paused",
        /// The source after a completed outgoing migration.
        Postmigrate = "postmigrate",
        /// Started with `-S` and never run.
        Prelaunch = "prelaunch",
        /// Finishing an outgoing migration.
        FinishMigrate = "finish-migrate",
        /// Loading a `loadvm` snapshot.
        RestoreVm = "restore-vm",
        /// Running.
        Running = "running",
        /// Writing a `savevm` snapshot.
        SaveVm = "save-vm",
        /// The guest shut down (with `-no-shutdown`, or while QEMU exits).
        Shutdown = "shutdown",
        /// The guest is suspended (ACPI S3).
        Suspended = "suspended",
        /// Stopped by a watchdog.
        Watchdog = "watchdog",
        /// The guest panicked (pvpanic).
        GuestPanicked = "guest-panicked",
        /// COLO fault tolerance.
        Colo = "colo",
    }
}

qemu_enum! {
    /// The state of a migration (`query-migrate`), QEMU 7.2's `MigrationStatus`.
    MigrationStatus {
        /// No migration yet (also what `query-migrate`'s empty answer means).
        None = "none",
        /// Starting.
        Setup = "setup",
        /// Being cancelled.
        Cancelling = "cancelling",
        /// Cancelled.
        Cancelled = "cancelled",
        /// Transferring.
        Active = "active",
        /// Postcopy transfer.
        PostcopyActive = "postcopy-active",
        /// Postcopy paused by a network failure.
        PostcopyPaused = "postcopy-paused",
        /// Postcopy recovering.
        PostcopyRecover = "postcopy-recover",
        /// Done.
        Completed = "completed",
        /// Failed; `error-desc` says why.
        Failed = "failed",
        /// COLO fault tolerance.
        Colo = "colo",
        /// Paused before switchover (the `pause-before-switchover` capability).
        PreSwitchover = "pre-switchover",
        /// Migrating device state after RAM.
        Device = "device",
        /// Waiting for failover devices to be unplugged.
        WaitUnplug = "wait-unplug",
    }
}

/// What `query-migrate` says about the last migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationStats {
    /// Where it stands.
    pub status: MigrationStatus,
    /// How long it took from start to completion, as QEMU measured it.
    pub total_time: Option<Duration>,
    /// How long the guest was stopped at the end (zero for a source stopped before).
    pub downtime: Option<Duration>,
    /// Bytes of RAM sent.
    pub ram_transferred_bytes: u64,
    /// Bytes of RAM to migrate; shared RAM is left out under `x-ignore-shared` (a
    /// 64 MiB guest then counts 76 KiB of ROMs and such).
    pub ram_total_bytes: u64,
    /// Why it failed, when it did.
    pub error_desc: Option<String>,
}

/// A block device, as much of `query-block` as snapshots need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// The device id (`-drive …,id=disk0` → `disk0`).
    pub device: String,
    /// The image the device reads and writes now; `None` without a medium. QEMU's
    /// name for it: usually a path, a `json:{…}` pseudo-name for composed nodes.
    pub file: Option<String>,
    /// That image's backing file, if it has one.
    pub backing_file: Option<String>,
}

#[derive(Deserialize)]
struct RawStatus {
    status: RunState,
}

#[derive(Deserialize)]
struct RawMigration {
    status: Option<MigrationStatus>,
    #[serde(rename = "total-time")]
    total_time_ms: Option<u64>,
    #[serde(rename = "downtime")]
    downtime_ms: Option<u64>,
    ram: Option<RawRam>,
    #[serde(rename = "error-desc")]
    error_desc: Option<String>,
}

#[derive(Deserialize)]
struct RawRam {
    transferred: u64,
    total: u64,
}

#[derive(Deserialize)]
struct RawBlock {
    device: String,
    inserted: Option<RawInserted>,
}

#[derive(Deserialize)]
struct RawInserted {
    file: String,
    backing_file: Option<String>,
}

impl From<RawMigration> for MigrationStats {
    fn from(raw: RawMigration) -> Self {
        Self {
            status: raw.status.unwrap_or(MigrationStatus::None),
            total_time: raw.total_time_ms.map(Duration::from_millis),
            downtime: raw.downtime_ms.map(Duration::from_millis),
            ram_transferred_bytes: raw.ram.as_ref().map_or(0, |ram| ram.transferred),
            ram_total_bytes: raw.ram.as_ref().map_or(0, |ram| ram.total),
            error_desc: raw.error_desc,
        }
    }
}

impl Qmp {
    /// The VM's run state (`query-status`).
    pub async fn query_status(&mut self) -> Result<RunState, QmpError> {
        self.query_status_by(self.command_deadline()).await
    }

    /// Pauses the VM's vCPUs (`stop`; QEMU emits `STOP`).
    pub async fn stop(&mut self) -> Result<(), QmpError> {
        self.execute("stop", Value::Null).await.map(drop)
    }

    /// Resumes the vCPUs (`cont`; QEMU emits `RESUME`). Also starts a VM in
    /// `prelaunch` or one restored into `paused`.
    pub async fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", Value::Null).await.map(drop)
    }

    /// Tells QEMU to exit (`quit`) and closes the session. QEMU may close the socket
    /// before its reply arrives; that counts as done. Reap the process separately.
    pub async fn quit(mut self) -> Result<(), QmpError> {
        match self.execute("quit", Value::Null).await {
            Ok(_) | Err(QmpError::Closed { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Turns migration capabilities on or off (`migrate-set-capabilities`), e.g.
    /// `[("x-ignore-shared", true)]`. Source and destination need the same ones.
    pub async fn set_migration_capabilities(
        &mut self,
        capabilities: &[(&str, bool)],
    ) -> Result<(), QmpError> {
        let capabilities: Vec<Value> = capabilities
            .iter()
            .map(|(capability, state)| json!({ "capability": capability, "state": state }))
            .collect();
        self.execute(
            "migrate-set-capabilities",
            json!({ "capabilities": capabilities }),
        )
        .await
        .map(drop)
    }

    /// Caps the migration's speed (`migrate-set-parameters max-bandwidth`). QEMU's
    /// default, 128 MiB/s, is for networks; a save to a local file wants far more.
    pub async fn set_max_bandwidth(&mut self, bytes_per_sec: u64) -> Result<(), QmpError> {
        self.execute(
            "migrate-set-parameters",
            json!({ "max-bandwidth": bytes_per_sec }),
        )
        .await
        .map(drop)
    }

    /// Starts an outgoing migration to `uri` (`unix:PATH`, `fd:NAME`, …) and
    /// returns at once; [`Qmp::wait_migration`] waits for the end. Stop the VM first
    /// for a consistent snapshot with no downtime accounting.
    pub async fn migrate(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate", json!({ "uri": uri }))
            .await
            .map(drop)
    }

    /// Starts an outgoing migration into the open file `file` (`getfd`, then
    /// `migrate fd:`): QEMU writes the stream itself. The `exec:cat > FILE` it
    /// replaces forked the whole QEMU and ran a shell and `cat` per capture, in the
    /// guest's pause.
    pub async fn migrate_to_file(&mut self, file: &std::fs::File) -> Result<(), QmpError> {
        self.send_fd(MIGRATION_FD_NAME, file).await?;
        let started = self.migrate(&format!("fd:{MIGRATION_FD_NAME}")).await;
        if started.is_err() {
            self.forget_migration_fd().await;
        }
        started
    }

    /// Best effort, after a migration command failed: QEMU takes the descriptor
    /// out of its list when it starts the migration, but one refused before that
    /// (another migration under way) stays, and would keep a file the launcher
    /// removes open in a VM that runs on. Not found (it was taken) is fine.
    async fn forget_migration_fd(&mut self) {
        if let Err(error) = self
            .execute("closefd", json!({ "fdname": MIGRATION_FD_NAME }))
            .await
        {
            tracing::debug!(%error, "closefd after a failed migration command");
        }
    }

    /// What `query-migrate` says now.
    pub async fn query_migrate(&mut self) -> Result<MigrationStats, QmpError> {
        self.query_migrate_by(self.command_deadline()).await
    }

    /// Polls `query-migrate` every [`MIGRATION_POLL`] until the outgoing migration
    /// completes ([`MigrationStats`]), fails ([`QmpError::MigrationFailed`] with
    /// QEMU's `error-desc`), is cancelled, or `timeout` passes.
    pub async fn wait_migration(&mut self, timeout: Duration) -> Result<MigrationStats, QmpError> {
        let deadline = Deadline::after(timeout);
        let mut last = MigrationStatus::None;
        loop {
            let poll = deadline.min(self.command_deadline());
            let stats = self.query_migrate_by(poll).await.map_err(|error| {
                waiting(
                    error,
                    deadline,
                    &format!("the migration to end (was {last})"),
                )
            })?;
            match stats.status {
                MigrationStatus::Completed => return Ok(stats),
                MigrationStatus::Failed => {
                    return Err(QmpError::MigrationFailed {
                        desc: stats
                            .error_desc
                            .unwrap_or_else(|| "QEMU gave no error-desc".into()),
                    })
                }
                MigrationStatus::Cancelled => return Err(QmpError::MigrationCancelled),
                status if deadline.passed() => {
                    return Err(deadline.expired(format!("the migration to end (was {status})")))
                }
                status => last = status,
            }
            tokio::time::sleep(MIGRATION_POLL).await;
        }
    }

    /// Starts loading an incoming migration from `uri` (`unix:PATH`, `fd:NAME`, …) into a QEMU
    /// started with `-incoming defer`. Set the same capabilities as the source first.
    pub async fn migrate_incoming(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate-incoming", json!({ "uri": uri }))
            .await
            .map(drop)
    }

    /// Starts loading an incoming migration from the open file `file` (`getfd`, then
    /// `migrate-incoming fd:`), with no `cat` between it and QEMU.
    pub async fn migrate_incoming_from_file(
        &mut self,
        file: &std::fs::File,
    ) -> Result<(), QmpError> {
        self.send_fd(MIGRATION_FD_NAME, file).await?;
        let started = self
            .migrate_incoming(&format!("fd:{MIGRATION_FD_NAME}"))
            .await;
        if started.is_err() {
            self.forget_migration_fd().await;
        }
        started
    }

    /// Polls `query-status` every [`MIGRATION_POLL`] until the destination leaves
    /// `inmigrate`, and returns the state it entered. That is the source's state at
    /// migration time: `paused` after a `stop`ped source, so the caller then issues
    /// [`Qmp::cont`]; `running` after a running one (see the module doc).
    pub async fn wait_incoming(&mut self, timeout: Duration) -> Result<RunState, QmpError> {
        const INCOMING: &str = "the destination to leave inmigrate";
        let deadline = Deadline::after(timeout);
        loop {
            let poll = deadline.min(self.command_deadline());
            let state = self
                .query_status_by(poll)
                .await
                .map_err(|error| waiting(error, deadline, INCOMING))?;
            if state != RunState::Inmigrate {
                return Ok(state);
            }
            if deadline.passed() {
                return Err(deadline.expired(INCOMING));
            }
            tokio::time::sleep(MIGRATION_POLL).await;
        }
    }

    /// Switches `device` (a `-drive …,id=` id) to a new image `snapshot_file` that
    /// QEMU creates in `format` (`qcow2`) with the current image as its backing file
    /// (`blockdev-snapshot-sync`). From then on writes go to the new file and the old
    /// one is read-only to the guest: a consistent disk snapshot of a stopped VM.
    pub async fn blockdev_snapshot_sync(
        &mut self,
        device: &str,
        snapshot_file: &Path,
        format: &str,
    ) -> Result<(), QmpError> {
        let Some(snapshot_file) = snapshot_file.to_str() else {
            return Err(QmpError::NonUtf8Path {
                path: snapshot_file.to_owned(),
            });
        };
        let arguments = json!({
            "device": device,
            "snapshot-file": snapshot_file,
            "format": format,
        });
        self.execute("blockdev-snapshot-sync", arguments)
            .await
            .map(drop)
    }

    /// The VM's block devices and the images behind them (`query-block`).
    pub async fn query_block(&mut self) -> Result<Vec<BlockDevice>, QmpError> {
        const COMMAND: &str = "query-block";
        let value = self.execute(COMMAND, Value::Null).await?;
        let raw: Vec<RawBlock> = decode(COMMAND, value)?;
        Ok(raw
            .into_iter()
            .map(|block| BlockDevice {
                device: block.device,
                file: block
                    .inserted
                    .as_ref()
                    .map(|inserted| inserted.file.clone()),
                backing_file: block.inserted.and_then(|inserted| inserted.backing_file),
            })
            .collect())
    }

    fn command_deadline(&self) -> Deadline {
        Deadline::after(self.command_timeout())
    }

    async fn query_status_by(&mut self, deadline: Deadline) -> Result<RunState, QmpError> {
        const COMMAND: &str = "query-status";
        let value = self.execute_by(COMMAND, Value::Null, deadline).await?;
        Ok(decode::<RawStatus>(COMMAND, value)?.status)
    }

    async fn query_migrate_by(&mut self, deadline: Deadline) -> Result<MigrationStats, QmpError> {
        const COMMAND: &str = "query-migrate";
        let value = self.execute_by(COMMAND, Value::Null, deadline).await?;
        Ok(decode::<RawMigration>(COMMAND, value)?.into())
    }
}

/// Decodes a command's `return` value.
fn decode<T: DeserializeOwned>(command: &str, value: Value) -> Result<T, QmpError> {
    serde_json::from_value(value).map_err(|error| QmpError::Answer {
        command: command.to_owned(),
        error,
    })
}

/// A poll's timeout, reported as the timeout of the whole wait when that is what ran
/// out; any other error as it is.
fn waiting(error: QmpError, deadline: Deadline, what: &str) -> QmpError {
    match error {
        QmpError::Timeout { .. } if deadline.passed() => deadline.expired(what),
        error => error,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::tests::session;
    use super::*;

    #[test]
    fn unknown_states_keep_their_spelling() {
        let state: RunState = serde_json::from_value(json!("running")).unwrap();
        assert_eq!(state, RunState::Running);
        let state: RunState = serde_json::from_value(json!("finish-migrate")).unwrap();
        assert_eq!(state, RunState::FinishMigrate);
        let state = RunState::from("hibernating".to_owned());
        assert_eq!(state, RunState::Other("hibernating".into()));
        assert_eq!(state.to_string(), "hibernating");
        assert_eq!(RunState::InternalError.as_str(), "internal-error");
        assert_eq!(
            MigrationStatus::from("wait-unplug".to_owned()),
            MigrationStatus::WaitUnplug
        );
    }

    #[test]
    fn migration_stats_come_from_query_migrate() {
        // QEMU 7.2.22, a stopped 64 MiB microvm saved with x-ignore-shared (trimmed).
        let completed = json!({
            "status": "completed", "setup-time": 0, "downtime": 0, "total-time": 3,
            "ram": { "total": 77824, "transferred": 33009, "remaining": 0, "mbps": 138.29 },
        });
        let stats: MigrationStats = decode::<RawMigration>("q", completed).unwrap().into();
        assert_eq!(stats.status, MigrationStatus::Completed);
        assert_eq!(stats.total_time, Some(Duration::from_millis(3)));
        assert_eq!(stats.downtime, Some(Duration::ZERO));
        assert_eq!(stats.ram_transferred_bytes, 33009);
        assert_eq!(stats.ram_total_bytes, 77824);
        // Before any migration QEMU answers an empty object.
        let none: MigrationStats = decode::<RawMigration>("q", json!({})).unwrap().into();
        assert_eq!(none.status, MigrationStatus::None);
        assert_eq!(none.total_time, None);
    }

    #[tokio::test]
    async fn a_refused_migration_to_a_file_takes_its_descriptor_back() {
        let (mut qmp, mut peer) = session().await;
        let path = std::env::temp_dir().join(format!("sbx-qmp-closefd-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (result, ()) = tokio::join!(qmp.migrate_to_file(&file), async {
            let (name, arguments, id) = peer.command().await;
            assert_eq!(name, "getfd");
            assert_eq!(arguments["fdname"], MIGRATION_FD_NAME);
            peer.reply(&id, json!({})).await;
            let (name, arguments, id) = peer.command().await;
            assert_eq!(name, "migrate");
            assert_eq!(arguments["uri"], format!("fd:{MIGRATION_FD_NAME}"));
            let refused = json!({
                "error": { "class": "GenericError", "desc": "There's a migration process in progress" },
                "id": id,
            });
            peer.send(&refused.to_string()).await;
            let (name, arguments, id) = peer.command().await;
            assert_eq!(name, "closefd");
            assert_eq!(arguments["fdname"], MIGRATION_FD_NAME);
            peer.reply(&id, json!({})).await;
        });
        let error = result.unwrap_err();
        assert!(error.to_string().contains("in progress"), "{error}");
    }

    #[tokio::test]
    async fn a_failed_migration_is_an_error_with_qemus_description() {
        let (mut qmp, mut peer) = session().await;
        let (result, ()) = tokio::join!(qmp.wait_migration(Duration::from_secs(5)), async {
            for answer in [
                json!({ "status": "setup" }),
                json!({ "status": "active" }),
                json!({ "status": "failed", "error-desc": "Unable to write to command: Broken pipe" }),
            ] {
                let (name, _, id) = peer.command().await;
                assert_eq!(name, "query-migrate");
                peer.reply(&id, answer).await;
            }
        });
        match result {
            Err(QmpError::MigrationFailed { desc }) => {
                assert_eq!(desc, "Unable to write to command: Broken pipe");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn waiting_for_an_incoming_migration_returns_the_state_after_inmigrate() {
        let (mut qmp, mut peer) = session().await;
        let (result, ()) = tokio::join!(qmp.wait_incoming(Duration::from_secs(5)), async {
            for status in ["inmigrate", "inmigrate", "paused"] {
                let (name, _, id) = peer.command().await;
                assert_eq!(name, "query-status");
                peer.reply(&id, json!({ "status": status, "running": false }))
                    .await;
            }
        });
        assert_eq!(result.unwrap(), RunState::Paused);
        // A wait that never ends names what it waited for.
        tokio::spawn(async move {
            loop {
                let (_, _, id) = peer.command().await;
                peer.reply(&id, json!({ "status": "inmigrate" })).await;
            }
        });
        let error = qmp
            .wait_incoming(Duration::from_millis(30))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("leave inmigrate"), "{error}");
    }

    #[tokio::test]
    async fn query_block_shows_the_image_and_its_backing_file() {
        let (mut qmp, mut peer) = session().await;
        // QEMU 7.2.22 after blockdev-snapshot-sync (trimmed), plus an empty drive.
        let answer = json!([
            {
                "device": "disk0", "locked": false, "removable": false, "type": "unknown",
                "inserted": {
                    "file": "/tmp/x/over.qcow2", "backing_file": "/tmp/x/base.qcow2",
                    "backing_file_depth": 1, "drv": "qcow2", "ro": false,
                    "image": { "filename": "/tmp/x/over.qcow2", "format": "qcow2" },
                },
            },
            { "device": "cd0", "locked": false, "removable": true, "type": "unknown" },
        ]);
        let (result, ()) = tokio::join!(qmp.query_block(), async {
            let (_, _, id) = peer.command().await;
            peer.reply(&id, answer).await;
        });
        assert_eq!(
            result.unwrap(),
            [
                BlockDevice {
                    device: "disk0".into(),
                    file: Some("/tmp/x/over.qcow2".into()),
                    backing_file: Some("/tmp/x/base.qcow2".into()),
                },
                BlockDevice {
                    device: "cd0".into(),
                    file: None,
                    backing_file: None,
                },
            ]
        );
    }
}
