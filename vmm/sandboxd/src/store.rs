//! Checkpoints in the object store (`--store`): what of a checkpoint folder goes up,
//! and how a checkpoint this node does not hold comes down
//! (`sandbox_fleet::store` moves the bytes).
//!
//! **Upload** ([`NodeStore::upload`]), after a capture: every file of the folder
//! (device state, the sparse RAM image, the frozen disk, kernel, initramfs, the
//! snapshot's agent token, its egress policy, `manifest.json`) and, for a machine
//! with a disk, the images the disk is based on (`backing-1`, `backing-2`, ...,
//! nearest first: the template's disk, or earlier checkpoints' disks), so a node
//! without the template can branch it. Then, with `--etcd`, the durable record
//! `P/checkpoints/<id>`.
//!
//! **Download** ([`NodeStore::fetch`]), before a claim of an id this node does not
//! hold: one at a time per id (a second claim waits for the first's download and
//! finds the folder), refused before any blob moves when the QEMU version or
//! machine type differs, written into `.tmp-<id>` (with its `maker`, so a sweep
//! removes what a killed daemon left), every blob checked by digest, the disk chain
//! re-pointed at the downloaded images (relative names: `qemu-img rebase -u`), and
//! renamed into place. A failure removes the temporary folder: nothing is left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sandbox_engine::moving::Parcel;
use sandbox_engine::record::ClaimRecord;
use sandbox_fleet::membership::{CheckpointRecord, FleetError, Membership};
use sandbox_fleet::store::{CheckpointStore, DownloadReport, StoreError, Upload, UploadReport};
use sandbox_vmm::launcher::snapshot::manifest::{
    read_manifest, DISK_FILE, MAKER_FILE, MANIFEST_FILE,
};
use sandbox_vmm::launcher::snapshot::users::backing_chain;
use sandbox_vmm::launcher::snapshot::{flatten, Manifest, RamImage};
use serde::{Deserialize, Serialize};

/// The log event of each download (the e2e test counts them).
pub const DOWNLOADED_EVENT: &str = "checkpoint downloaded from the store";

/// The log event of each template download.
pub const TEMPLATE_DOWNLOADED_EVENT: &str = "template downloaded from the store";

/// What goes with a template's manifest into the store's `meta`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateMeta {
    /// The disk chains of its snapshot folders, nearest first.
    #[serde(default)]
    backing: BTreeMap<String, Vec<Backing>>,
}

/// The log event of each parked sandbox's image download.
pub const PARKED_DOWNLOADED_EVENT: &str = "parked sandbox image downloaded from the store";

/// What goes with a checkpoint's manifest into the store's `meta`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    /// The checkpoint's `manifest.json`.
    manifest: Manifest,
    /// The disk's backing images, nearest first.
    #[serde(default)]
    backing: Vec<Backing>,
}

/// One image of the disk's backing chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Backing {
    /// Its file name in the checkpoint folder (`backing-N`).
    name: String,
    /// `qcow2` or `raw`.
    format: String,
}

/// What goes with a parked sandbox's hibernation image into the store's `meta`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParkedMeta {
    /// The image's `manifest.json`.
    manifest: Manifest,
    /// The disk's backing images, nearest first.
    #[serde(default)]
    backing: Vec<Backing>,
    /// The image's folder name in the run folder (`hibernation-...`).
    image: String,
    /// The sandbox's claim: id, token, template, size, deadline, lineage.
    claim: ClaimRecord,
    /// The token of the agent inside the VM.
    vm_token: String,
}

/// A parked sandbox's image, arrived in a run folder.
#[derive(Debug)]
pub struct Arrived {
    /// The image's folder name in the run folder.
    pub image: String,
    /// The sandbox's claim.
    pub claim: ClaimRecord,
    /// The agent's token.
    pub vm_token: String,
    /// What moved.
    pub report: DownloadReport,
}

/// A store operation of this node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeStoreError {
    /// The store refused or did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The checkpoint was taken and kept here, but its upload failed.
    #[error("Checkpoint {id} was taken and is kept on this node, but its upload failed")]
    Upload {
        /// The checkpoint.
        id: String,
        /// Why.
        #[source]
        error: StoreError,
    },
    /// The checkpoint is in the store, but its etcd record could not be put.
    #[error("Checkpoint {id} is in the store, but its fleet record could not be written")]
    Record {
        /// The checkpoint.
        id: String,
        /// Why.
        #[source]
        error: FleetError,
    },
    /// etcd failed otherwise.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The local checkpoint folder could not be read or prepared.
    #[error("Checkpoint {id}: cannot {what}: {why}")]
    Local {
        /// The checkpoint.
        id: String,
        /// What was being done.
        what: &'static str,
        /// What failed.
        why: String,
    },
}

impl NodeStoreError {
    /// The store error at the root, if any.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(error) | Self::Upload { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// This node's view of the object store.
#[derive(Debug)]
pub struct NodeStore {
    store: CheckpointStore,
    /// The same store's parked sandbox images.
    parked: CheckpointStore,
    /// The same store's published templates.
    templates: CheckpointStore,
    templates_root: PathBuf,
    membership: Option<Membership>,
    node_id: String,
    checkpoint_root: PathBuf,
    qemu_img: PathBuf,
    qemu_version: Option<String>,
    machine: String,
    /// Downloads under way, one per checkpoint id or template.
    flights: crate::flights::Flights,
    /// Checkpoints downloaded since start.
    downloads: AtomicU64,
}

impl NodeStore {
    /// The store of a node whose checkpoints live in `checkpoint_root`.
    pub fn new(
        store: CheckpointStore,
        membership: Option<Membership>,
        node_id: String,
        launcher: &sandbox_vmm::launcher::LauncherConfig,
    ) -> Self {
        let qemu_version = std::process::Command::new(&launcher.qemu_path)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()
            .ok()
            .and_then(|out| {
                sandbox_vmm::launcher::snapshot::restore::parse_qemu_version(
                    &String::from_utf8_lossy(&out.stdout),
                )
            });
        sweep_template_downloads(&launcher.templates_root());
        Self {
            parked: store.parked(),
            templates: store.templates(),
            templates_root: launcher.templates_root(),
            store,
            membership,
            node_id,
            checkpoint_root: launcher.checkpoint_root.clone(),
            qemu_img: launcher.qemu_img_path.clone(),
            qemu_version,
            machine: std::env::consts::ARCH.to_owned(),
            flights: crate::flights::Flights::default(),
            downloads: AtomicU64::new(0),
        }
    }

    /// The store's name (`s3://BUCKET/PREFIX at ENDPOINT`).
    pub fn name(&self) -> &str {
        self.store.name()
    }

    /// This node's QEMU version (`major.minor.micro`), when it could be told.
    pub fn qemu_version(&self) -> Option<&str> {
        self.qemu_version.as_deref()
    }

    /// Checkpoints downloaded since start.
    pub fn downloads(&self) -> u64 {
        self.downloads.load(Ordering::Relaxed)
    }

    /// The ids of the checkpoints in the store.
    pub async fn list(&self) -> Result<Vec<String>, NodeStoreError> {
        Ok(self.store.list().await?)
    }

    /// Uploads the local checkpoint `manifest` describes, then records it in etcd.
    pub async fn upload(&self, manifest: &Manifest) -> Result<UploadReport, NodeStoreError> {
        let id = manifest.id.clone();
        let folder = &self.checkpoint_root.join(&id);
        let local = |what: &'static str| {
            let id = id.clone();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        // The store holds whole images: an incremental one is flattened first.
        let manifest = {
            let (root, folder) = (self.checkpoint_root.clone(), folder.clone());
            tokio::task::spawn_blocking(move || flatten(&root, &folder))
                .await
                .map_err(|e| local("flatten its RAM")(e.to_string()))?
                .map_err(|e| local("flatten its RAM")(sandbox_vmm::error_chain(&e)))?
        };
        let manifest = &manifest;
        let (files, backing) = folder_files(folder, manifest).map_err(local("list its files"))?;
        let meta = serde_json::to_value(Meta {
            manifest: manifest.clone(),
            backing,
        })
        .map_err(|e| local("describe it")(e.to_string()))?;
        let report = self
            .store
            .upload(Upload {
                id: id.clone(),
                qemu_version: manifest.qemu_version.clone(),
                machine: self.machine.clone(),
                node_id: self.node_id.clone(),
                meta,
                files,
            })
            .await
            .map_err(|error| NodeStoreError::Upload {
                id: id.clone(),
                error,
            })?;
        if let Some(membership) = &self.membership {
            let record = CheckpointRecord {
                node_id: self.node_id.clone(),
                manifest_key: self.store.manifest_key(&id),
                qemu_version: manifest.qemu_version.clone(),
                machine: self.machine.clone(),
                data_bytes: report.data_bytes,
                stored_unix: now_unix(),
            };
            membership
                .put_checkpoint(&id, &record)
                .await
                .map_err(|error| NodeStoreError::Record { id, error })?;
        }
        Ok(report)
    }

    /// Makes checkpoint `id` local, downloading it when this node lacks it; `None`
    /// when it was here already (or another claim's download brought it).
    pub async fn fetch(&self, id: &str) -> Result<Option<DownloadReport>, NodeStoreError> {
        let folder = self.checkpoint_root.join(id);
        self.flights
            .one_at_a_time(id, async {
                if folder.join(MANIFEST_FILE).is_file() {
                    Ok(None)
                } else {
                    self.download(id, &folder).await.map(Some)
                }
            })
            .await
    }

    async fn download(&self, id: &str, folder: &Path) -> Result<DownloadReport, NodeStoreError> {
        let stored = self
            .store
            .manifest(id)
            .await?
            .ok_or_else(|| StoreError::NotFound { id: id.to_owned() })?;
        CheckpointStore::check_compatible(&stored, self.qemu_version.as_deref(), &self.machine)?;
        let meta: Meta = meta_of(&stored, id)?;
        let local = |what: &'static str| {
            let id = id.to_owned();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        std::fs::create_dir_all(&self.checkpoint_root)
            .map_err(|e| local("create the checkpoints folder")(e.to_string()))?;
        let temp = TempFolder::create(&self.checkpoint_root.join(format!(".tmp-{id}")))
            .map_err(|e| local("create its temporary folder")(e.to_string()))?;
        valid_chain(&meta.backing).map_err(|why| invalid_meta(id, why))?;
        valid_identity(&meta.manifest, id).map_err(|why| invalid_meta(id, why))?;
        let report = self.store.download(&stored, temp.path()).await?;
        // The disk chain, re-pointed at the downloaded images (relative: valid once
        // the folder is renamed).
        let mut overlay = temp.path().join(DISK_FILE);
        for image in &meta.backing {
            self.rebase(&overlay, &image.name, &image.format)
                .await
                .map_err(local("re-point its disk chain"))?;
            if image.format != "qcow2" {
                break;
            }
            overlay = temp.path().join(&image.name);
        }
        let expected: Vec<PathBuf> = followed(&meta.backing)
            .iter()
            .map(|b| temp.path().join(&b.name))
            .collect();
        check_chain(&temp.path().join(DISK_FILE), &expected)
            .map_err(local("check its disk chain"))?;
        check_images_inside(temp.path()).map_err(local("check its disk images"))?;
        let mut manifest = meta.manifest;
        manifest.disk_backing = meta.backing.first().map(|b| folder.join(&b.name));
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| local("write its manifest")(e.to_string()))?;
        std::fs::write(temp.path().join(MANIFEST_FILE), text)
            .map_err(|e| local("write its manifest")(e.to_string()))?;
        read_manifest(temp.path()).map_err(|e| local("read its manifest back")(e.to_string()))?;
        temp.commit(folder)
            .map_err(|e| local("move it into place")(e.to_string()))?;
        self.downloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            checkpoint = %id,
            data_bytes = report.data_bytes,
            received_bytes = report.received_bytes,
            blobs = report.blobs,
            took_ms = report.took_ms,
            "{DOWNLOADED_EVENT}"
        );
        Ok(report)
    }

    /// `qemu-img rebase -u`: `overlay`'s header names `backing` (a sibling) instead.
    async fn rebase(&self, overlay: &Path, backing: &str, format: &str) -> Result<(), String> {
        let mut command = tokio::process::Command::new(&self.qemu_img);
        command
            .args(["rebase", "-u", "-f", "qcow2", "-F", format, "-b", backing])
            .arg(overlay)
            .stdin(std::process::Stdio::null());
        let output = command
            .output()
            .await
            .map_err(|e| format!("{}: {e}", self.qemu_img.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    }

    /// The store key of parked sandbox `id`'s image manifest.
    pub fn parked_manifest_key(&self, id: &str) -> String {
        self.parked.manifest_key(id)
    }

    /// Uploads the hibernation image of the sandbox leaving in `parcel` (its files,
    /// its disk's backing chain, its claim and agent token in the manifest's meta),
    /// manifest last.
    pub async fn upload_parked(&self, parcel: &Parcel) -> Result<UploadReport, NodeStoreError> {
        let id = parcel.sandbox_id.clone();
        let local = |what: &'static str| {
            let id = id.clone();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        let folder = parcel.run_folder.join(&parcel.image);
        let manifest =
            read_manifest(&folder).map_err(|e| local("read its image")(e.to_string()))?;
        let (files, backing) = folder_files(&folder, &manifest).map_err(local("list its image"))?;
        let meta = serde_json::to_value(ParkedMeta {
            manifest: manifest.clone(),
            backing,
            image: parcel.image.clone(),
            claim: parcel.claim.clone(),
            vm_token: parcel.vm_token.clone(),
        })
        .map_err(|e| local("describe it")(e.to_string()))?;
        self.parked
            .upload(Upload {
                id: id.clone(),
                qemu_version: manifest.qemu_version.clone(),
                machine: self.machine.clone(),
                node_id: self.node_id.clone(),
                meta,
                files,
            })
            .await
            .map_err(|error| NodeStoreError::Upload { id, error })
    }

    /// Downloads parked sandbox `id`'s image into the run folder `run` (made by
    /// `Launcher::receive_hibernated`): the image in its `hibernation-...` folder,
    /// every blob checked by digest, its disk chain beside it and re-pointed there
    /// (absolute paths: the woken disk's overlay lives in the run folder, the image
    /// folder goes after the wake). Refused before any blob moves when the QEMU
    /// version or machine type differs. A failure leaves files in `run`: the caller
    /// drops the run folder.
    pub async fn download_parked(&self, id: &str, run: &Path) -> Result<Arrived, NodeStoreError> {
        let stored = self
            .parked
            .manifest(id)
            .await?
            .ok_or_else(|| StoreError::NotFound { id: id.to_owned() })?;
        CheckpointStore::check_compatible(&stored, self.qemu_version.as_deref(), &self.machine)?;
        let invalid = |why: String| StoreError::Manifest {
            id: id.to_owned(),
            error: sandbox_fleet::store::ManifestError::Invalid(why),
        };
        let meta: ParkedMeta = serde_json::from_value(stored.meta.clone())
            .map_err(|e| invalid(format!("its meta: {e}")))?;
        let image_ok = meta.image.starts_with("hibernation-")
            && sandbox_fleet::store::manifest::safe_name(&meta.image);
        let backing_ok = meta.backing.iter().all(|b| {
            b.name.starts_with("backing-") && sandbox_fleet::store::manifest::safe_name(&b.name)
        });
        if !image_ok || !backing_ok || meta.claim.id != id {
            return Err(
                invalid("its image, backing or claim names are not this sandbox's".into()).into(),
            );
        }
        let local = |what: &'static str| {
            let id = id.to_owned();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        let folder = run.join(&meta.image);
        std::fs::create_dir(&folder)
            .map_err(|e| local("create its image folder")(e.to_string()))?;
        let report = self.parked.download(&stored, &folder).await?;
        let mut overlay = folder.join(DISK_FILE);
        for image in &meta.backing {
            let beside = run.join(&image.name);
            std::fs::rename(folder.join(&image.name), &beside)
                .map_err(|e| local("move its disk chain")(e.to_string()))?;
            self.rebase(&overlay, &beside.to_string_lossy(), &image.format)
                .await
                .map_err(local("re-point its disk chain"))?;
            if image.format != "qcow2" {
                break;
            }
            overlay = beside;
        }
        let expected: Vec<PathBuf> = followed(&meta.backing)
            .iter()
            .map(|b| run.join(&b.name))
            .collect();
        check_chain(&folder.join(DISK_FILE), &expected).map_err(local("check its disk chain"))?;
        check_images_inside(run).map_err(local("check its disk images"))?;
        let mut manifest = meta.manifest;
        manifest.disk_backing = meta.backing.first().map(|b| run.join(&b.name));
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| local("write its manifest")(e.to_string()))?;
        std::fs::write(folder.join(MANIFEST_FILE), text)
            .map_err(|e| local("write its manifest")(e.to_string()))?;
        read_manifest(&folder).map_err(|e| local("read its manifest back")(e.to_string()))?;
        tracing::info!(
            sandbox = %id,
            data_bytes = report.data_bytes,
            received_bytes = report.received_bytes,
            took_ms = report.took_ms,
            "{PARKED_DOWNLOADED_EVENT}"
        );
        Ok(Arrived {
            image: meta.image,
            claim: meta.claim,
            vm_token: meta.vm_token,
            report,
        })
    }

    /// Publishes the local template in `dir` as `name`: every file of its folder and
    /// of its `snapshot/` and `ready/` folders, and the disk chains those snapshots
    /// back onto (as `DIR/backing-N`), manifest last. Any node on the store can
    /// then claim it.
    pub async fn publish_template(
        &self,
        name: &str,
        dir: &Path,
    ) -> Result<UploadReport, NodeStoreError> {
        let local = |what: &'static str| {
            let id = name.to_owned();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        let dir = dir.to_owned();
        let listed = tokio::task::spawn_blocking(move || template_files(&dir))
            .await
            .map_err(|e| local("list its files")(e.to_string()))?
            .map_err(local("list its files"))?;
        let (files, backing) = listed;
        let meta = serde_json::to_value(TemplateMeta { backing })
            .map_err(|e| local("describe it")(e.to_string()))?;
        self.templates
            .upload(Upload {
                id: name.to_owned(),
                qemu_version: self.qemu_version.clone().unwrap_or_default(),
                machine: self.machine.clone(),
                node_id: self.node_id.clone(),
                meta,
                files,
            })
            .await
            .map_err(|error| NodeStoreError::Upload {
                id: name.to_owned(),
                error,
            })
    }

    /// Makes template `name` local when the store has it and this node does not:
    /// downloaded once (concurrent claims wait for it) into a temporary folder,
    /// every blob checked by digest, its snapshots' disk chains re-pointed, loaded
    /// as a template to be sure, then renamed into the templates folder. `Ok(None)`
    /// when it is here already or the store has no such template.
    pub async fn fetch_template(
        &self,
        name: &str,
    ) -> Result<Option<DownloadReport>, NodeStoreError> {
        if !sandbox_fleet::store::manifest::safe_name(name) {
            return Ok(None);
        }
        let folder = self.templates_root.join(name);
        self.flights
            .one_at_a_time(&format!("template/{name}"), async {
                if folder.join("template.json").is_file() {
                    Ok(None)
                } else {
                    self.download_template(name, &folder).await
                }
            })
            .await
    }

    async fn download_template(
        &self,
        name: &str,
        folder: &Path,
    ) -> Result<Option<DownloadReport>, NodeStoreError> {
        let Some(stored) = self.templates.manifest(name).await? else {
            return Ok(None);
        };
        CheckpointStore::check_compatible(&stored, self.qemu_version.as_deref(), &self.machine)?;
        let meta: TemplateMeta = meta_of(&stored, name)?;
        let local = |what: &'static str| {
            let id = name.to_owned();
            move |why: String| NodeStoreError::Local { id, what, why }
        };
        std::fs::create_dir_all(&self.templates_root)
            .map_err(|e| local("create the templates folder")(e.to_string()))?;
        // Not `.tmp-`: a promote's sweep would take a long download for its own
        // leftovers. Swept at start instead (`sweep_template_downloads`).
        let temp = TempFolder::create(&self.templates_root.join(format!(".download-{name}")))
            .map_err(|e| local("create its temporary folder")(e.to_string()))?;
        for (sub, chain) in &meta.backing {
            if !SNAPSHOT_FOLDERS.contains(&sub.as_str()) {
                return Err(local("re-point its disk chain")(format!(
                    "{sub} is no snapshot folder"
                )));
            }
            valid_chain(chain).map_err(|why| invalid_meta(name, why))?;
        }
        let report = self.templates.download(&stored, temp.path()).await?;
        for (sub, chain) in &meta.backing {
            let mut overlay = temp.path().join(sub).join(DISK_FILE);
            for image in chain {
                self.rebase(&overlay, &image.name, &image.format)
                    .await
                    .map_err(local("re-point its disk chain"))?;
                if image.format != "qcow2" {
                    break;
                }
                overlay = temp.path().join(sub).join(&image.name);
            }
        }
        for sub in SNAPSHOT_FOLDERS {
            let chain = meta.backing.get(sub).map_or(&[][..], Vec::as_slice);
            let expected: Vec<PathBuf> = followed(chain)
                .iter()
                .map(|b| temp.path().join(sub).join(&b.name))
                .collect();
            check_chain(&temp.path().join(sub).join(DISK_FILE), &expected)
                .map_err(local("check its disk chain"))?;
        }
        check_images_inside(temp.path()).map_err(local("check its disk images"))?;
        check_template_manifest(temp.path(), name).map_err(local("check its template.json"))?;
        sandbox_vmm::launcher::template::Template::load(temp.path())
            .map_err(|e| local("load it")(sandbox_vmm::error_chain(&e)))?;
        temp.commit(folder)
            .map_err(|e| local("move it into place")(e.to_string()))?;
        // Its writer's pid was for a sweep of an unfinished download.
        let _ = std::fs::remove_file(folder.join(MAKER_FILE));
        tracing::info!(
            template = %name,
            data_bytes = report.data_bytes,
            received_bytes = report.received_bytes,
            took_ms = report.took_ms,
            "{TEMPLATE_DOWNLOADED_EVENT}"
        );
        Ok(Some(report))
    }

    /// Deletes the store's blobs that no manifest names and are older than `grace`
    /// (`sandbox_fleet::store::gc`).
    pub async fn collect_garbage(
        &self,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<sandbox_fleet::store::gc::GcReport, NodeStoreError> {
        Ok(self.store.collect_garbage(grace, dry_run).await?)
    }

    /// Removes template `name` from the store; true when it was there.
    pub async fn delete_template(&self, name: &str) -> Result<bool, NodeStoreError> {
        Ok(self.templates.delete(name).await?)
    }

    /// Removes parked sandbox `id`'s image manifest (its blobs stay).
    pub async fn delete_parked(&self, id: &str) -> Result<bool, NodeStoreError> {
        Ok(self.parked.delete(id).await?)
    }

    /// Removes checkpoint `id` from the store and its etcd record; true when the
    /// store had it.
    pub async fn delete(&self, id: &str) -> Result<bool, NodeStoreError> {
        let had = self.store.delete(id).await?;
        if let Some(membership) = &self.membership {
            membership.delete_checkpoint(id).await?;
        }
        Ok(had)
    }
}

/// Files to upload: each one's name in the store and its path here.
type Files = Vec<(String, PathBuf)>;

/// A template's folders that hold a snapshot (promoted, ready).
const SNAPSHOT_FOLDERS: [&str; 2] = ["snapshot", "ready"];

/// The files of the template folder `dir`, and the disk chains of its snapshot
/// folders (uploaded as `DIR/backing-N` beside the snapshot's disk).
fn template_files(dir: &Path) -> Result<(Files, BTreeMap<String, Vec<Backing>>), String> {
    let mut files = Vec::new();
    let mut chains = BTreeMap::new();
    let plain = |path: &Path| -> Result<Files, String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))? {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().is_ok_and(|t| t.is_file())
                && !name.starts_with('.')
                && name != MAKER_FILE
            {
                found.push((name, entry.path()));
            }
        }
        Ok(found)
    };
    files.extend(plain(dir)?);
    for sub in SNAPSHOT_FOLDERS {
        let folder = dir.join(sub);
        if !folder.is_dir() {
            continue;
        }
        for (name, path) in plain(&folder)? {
            files.push((format!("{sub}/{name}"), path));
        }
        let disk = folder.join(DISK_FILE);
        if disk.is_file() {
            let mut chain = Vec::new();
            for (index, image) in backing_chain(&disk).into_iter().enumerate() {
                let name = format!("backing-{}", index + 1);
                chain.push(Backing {
                    name: name.clone(),
                    format: image_format(&image),
                });
                files.push((format!("{sub}/{name}"), image));
            }
            if !chain.is_empty() {
                chains.insert(sub.to_owned(), chain);
            }
        }
    }
    files.sort();
    Ok((files, chains))
}

/// The files of the checkpoint or image `folder` that `manifest` describes, and of
/// its disk's backing chain (`backing-N`, nearest first).
fn folder_files(folder: &Path, manifest: &Manifest) -> Result<(Files, Vec<Backing>), String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(folder).map_err(|e| e.to_string())?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        // `maker` is this host's writer pid: meaningless elsewhere.
        // Dot-files are scratch (a flatten's half-written image).
        if is_file && name != MAKER_FILE && !name.starts_with('.') {
            files.push((name, entry.path()));
        }
    }
    files.sort();
    let mut backing = Vec::new();
    if manifest.machine.disk {
        for (index, image) in backing_chain(&folder.join(DISK_FILE))
            .into_iter()
            .enumerate()
        {
            let name = format!("backing-{}", index + 1);
            backing.push(Backing {
                name: name.clone(),
                format: image_format(&image),
            });
            files.push((name, image));
        }
    }
    Ok((files, backing))
}

/// The `meta` of stored manifest `stored` (of `id`), as this node wrote it.
fn meta_of<T: serde::de::DeserializeOwned>(
    stored: &sandbox_fleet::store::StoredCheckpoint,
    id: &str,
) -> Result<T, NodeStoreError> {
    serde_json::from_value(stored.meta.clone())
        .map_err(|e| invalid_meta(id, format!("its meta: {e}")))
}

/// A stored manifest's meta that this node refuses to act on.
/// A stored manifest names the checkpoint it is stored as, and its RAM is whole:
/// uploads are flattened, and an incremental image's base is a local checkpoint's id,
/// which a stored one could point at another checkpoint of this node.
fn valid_identity(manifest: &Manifest, id: &str) -> Result<(), String> {
    if manifest.id != id {
        return Err(format!("it describes checkpoint {:?}", manifest.id));
    }
    if manifest.ram == RamImage::Diff || manifest.ram_base.is_some() {
        return Err("its RAM is an incremental image".into());
    }
    Ok(())
}

fn invalid_meta(id: &str, why: String) -> NodeStoreError {
    NodeStoreError::Store(StoreError::Manifest {
        id: id.to_owned(),
        error: sandbox_fleet::store::ManifestError::Invalid(why),
    })
}

/// Refuses a stored disk chain whose names are not `backing-N` or whose formats
/// are not qcow2 or raw: the names become `qemu-img rebase` arguments and paths.
fn valid_chain(chain: &[Backing]) -> Result<(), String> {
    for image in chain {
        let numbered = image.name.strip_prefix("backing-").is_some_and(|n| {
            !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit())
        });
        if !numbered {
            return Err(format!("its disk chain names {:?}", image.name));
        }
        if image.format != "qcow2" && image.format != "raw" {
            return Err(format!("its disk chain has the format {:?}", image.format));
        }
    }
    Ok(())
}

/// Refuses any downloaded qcow2 image in `folder` (and its folders) that names a
/// file outside `folder` as its backing, or that keeps its data in an external
/// file: QEMU would open those host paths for the VM.
fn check_images_inside(folder: &Path) -> Result<(), String> {
    let root = folder
        .canonicalize()
        .map_err(|e| format!("{}: {e}", folder.display()))?;
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let entry = entry.map_err(|e| e.to_string())?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            if !kind.is_file() || image_format(&path) != "qcow2" {
                continue;
            }
            if qcow2_external_data(&path) {
                return Err(format!(
                    "{} keeps its data in an external file: refused",
                    path.display()
                ));
            }
            let chain = backing_chain(&path);
            if let Some(outside) = chain.iter().find(|b| !b.starts_with(&root)) {
                return Err(format!(
                    "{} backs onto {}, outside what was downloaded: refused",
                    path.display(),
                    outside.display()
                ));
            }
        }
    }
    Ok(())
}

/// Whether a qcow2 image's header sets the external data file feature
/// (incompatible feature bit 2, version 3 and later).
fn qcow2_external_data(path: &Path) -> bool {
    let mut header = [0u8; 80];
    let read = std::fs::File::open(path)
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut header));
    if read.is_err() {
        // Too short for a version 3 header with features.
        return false;
    }
    let version = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let mut features = [0u8; 8];
    features.copy_from_slice(&header[72..80]);
    version >= 3 && u64::from_be_bytes(features) & (1 << 2) != 0
}

/// Refuses a downloaded `template.json` whose name is not the template's or
/// whose paths are not plain relative paths inside its folder.
fn check_template_manifest(folder: &Path, name: &str) -> Result<(), String> {
    let text = std::fs::read(folder.join("template.json")).map_err(|e| e.to_string())?;
    let manifest: serde_json::Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if manifest["name"].as_str() != Some(name) {
        return Err(format!("it names the template {}", manifest["name"]));
    }
    for key in ["kernel", "initramfs", "disk", "snapshot"] {
        let Some(path) = manifest[key].as_str() else {
            continue;
        };
        let inside = !path.is_empty()
            && Path::new(path)
                .components()
                .all(|part| matches!(part, std::path::Component::Normal(_)));
        if !inside {
            return Err(format!(
                "its {key} is {path:?}, not a path inside its folder"
            ));
        }
    }
    Ok(())
}

/// Removes what killed template downloads left in `root` (`.download-*` folders
/// whose writer is gone).
fn sweep_template_downloads(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(".download-") {
            continue;
        }
        let writer_alive = std::fs::read_to_string(entry.path().join(MAKER_FILE))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !writer_alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The images of `chain` a disk actually goes through once re-pointed: up to and
/// including the first that is not qcow2 (a raw image has no backing).
fn followed(chain: &[Backing]) -> &[Backing] {
    let end = chain
        .iter()
        .position(|b| b.format != "qcow2")
        .map_or(chain.len(), |raw| raw + 1);
    &chain[..end]
}

/// Refuses a downloaded disk `top` whose backing chain is not exactly `expected`:
/// an image from the store whose last qcow2 names a backing file of its own would
/// have the VM read a file of this host. No `top` (a machine without a disk) is
/// fine when nothing is expected.
fn check_chain(top: &Path, expected: &[PathBuf]) -> Result<(), String> {
    if !top.exists() {
        return if expected.is_empty() {
            Ok(())
        } else {
            Err("its disk is missing".to_owned())
        };
    }
    let found = backing_chain(top);
    let expected: Vec<PathBuf> = expected
        .iter()
        .map(|path| path.canonicalize().unwrap_or_else(|_| path.clone()))
        .collect();
    if found == expected {
        Ok(())
    } else {
        Err(format!(
            "its disk's backing chain is {found:?}, not the downloaded {expected:?}: refused"
        ))
    }
}

/// [`NodeStore::fetch`] in a task of its own: a claim whose client hangs up does
/// not cancel the download others wait for (the next claim finds it done, or
/// waits for it).
pub async fn fetch_detached(
    store: &Arc<NodeStore>,
    id: &str,
) -> Result<Option<DownloadReport>, NodeStoreError> {
    let (store, id) = (store.clone(), id.to_owned());
    tokio::spawn(async move { store.fetch(&id).await })
        .await
        .map_err(|e| NodeStoreError::Local {
            id: String::new(),
            what: "download it",
            why: e.to_string(),
        })?
}

/// [`NodeStore::fetch_template`] in a task of its own, as [`fetch_detached`].
pub async fn fetch_template_detached(
    store: &Arc<NodeStore>,
    name: &str,
) -> Result<Option<DownloadReport>, NodeStoreError> {
    let (store, name) = (store.clone(), name.to_owned());
    tokio::spawn(async move { store.fetch_template(&name).await })
        .await
        .map_err(|e| NodeStoreError::Local {
            id: String::new(),
            what: "download it",
            why: e.to_string(),
        })?
}

/// `qcow2` when the image starts with qcow2's magic, else `raw`.
fn image_format(image: &Path) -> String {
    let mut magic = [0u8; 4];
    let qcow2 = std::fs::File::open(image)
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut magic))
        .is_ok()
        && &magic == b"QFI\xfb";
    if qcow2 { "qcow2" } else { "raw" }.to_owned()
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A download's folder: removed on drop unless committed. Its `maker` (this pid)
/// lets the launcher's sweep remove it if the daemon is killed mid-download.
struct TempFolder {
    path: PathBuf,
    committed: bool,
}

impl TempFolder {
    fn create(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        // A leftover of a killed download of the same id.
        let _ = std::fs::remove_dir_all(path);
        std::fs::DirBuilder::new().mode(0o700).create(path)?;
        let folder = Self {
            path: path.to_owned(),
            committed: false,
        };
        std::fs::write(path.join(MAKER_FILE), std::process::id().to_string())?;
        Ok(folder)
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn commit(mut self, to: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, to)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_downloaded_disk_must_back_onto_exactly_what_was_downloaded() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("backing-1");
        std::fs::write(&base, vec![0u8; 1 << 20]).unwrap();
        let top = dir.path().join(DISK_FILE);
        let made = std::process::Command::new("qemu-img")
            .args([
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                "backing-1",
            ])
            .arg(&top)
            .status()
            .expect("qemu-img (scripts/setup.sh installs it)");
        assert!(made.success());
        check_chain(&top, std::slice::from_ref(&base)).unwrap();
        // A disk that names a file of its own (a tampered store): refused.
        let refused = check_chain(&top, &[]).unwrap_err();
        assert!(refused.contains("refused"), "{refused}");
        check_chain(&dir.path().join("none"), &[]).unwrap();
        assert!(check_chain(&dir.path().join("none"), std::slice::from_ref(&base)).is_err());
        let raw = |name: &str| Backing {
            name: name.into(),
            format: "raw".into(),
        };
        let qcow2 = |name: &str| Backing {
            name: name.into(),
            format: "qcow2".into(),
        };
        let chain = [qcow2("backing-1"), raw("backing-2"), qcow2("backing-3")];
        assert_eq!(followed(&chain).len(), 2);
        assert_eq!(followed(&chain[..1]).len(), 1);
    }

    #[test]
    fn stored_images_may_name_only_what_came_with_them() {
        let b = |name: &str, format: &str| Backing {
            name: name.into(),
            format: format.into(),
        };
        assert!(valid_chain(&[b("backing-1", "qcow2"), b("backing-2", "raw")]).is_ok());
        for bad in [
            b("/var/lib/x/disk.qcow2", "qcow2"),
            b("../backing-1", "qcow2"),
            b("backing-", "raw"),
            b("backing-1", "vmdk"),
        ] {
            assert!(valid_chain(std::slice::from_ref(&bad)).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let host_file = outside.path().join("secret");
        std::fs::write(&host_file, vec![0u8; 1 << 20]).unwrap();
        let qemu_img = |args: &[&str], path: &Path| {
            let made = std::process::Command::new("qemu-img")
                .args(args)
                .arg(path)
                .status()
                .expect("qemu-img (scripts/setup.sh installs it)");
            assert!(made.success());
        };
        let inside = dir.path().join("snapshot");
        std::fs::create_dir(&inside).unwrap();
        std::fs::write(inside.join("backing-1"), vec![0u8; 1 << 20]).unwrap();
        qemu_img(
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                "backing-1",
            ],
            &inside.join(DISK_FILE),
        );
        check_images_inside(dir.path()).unwrap();
        let host = host_file.to_string_lossy().into_owned();
        qemu_img(
            &["create", "-q", "-f", "qcow2", "-F", "raw", "-b", &host],
            &dir.path().join("rootfs.qcow2"),
        );
        let refused = check_images_inside(dir.path()).unwrap_err();
        assert!(refused.contains("outside"), "{refused}");
        std::fs::remove_file(dir.path().join("rootfs.qcow2")).unwrap();
        let data_file = outside.path().join("data").to_string_lossy().into_owned();
        let made = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-o"])
            .arg(format!("data_file={data_file}"))
            .arg(dir.path().join("external.qcow2"))
            .arg("1M")
            .status()
            .unwrap();
        assert!(made.success());
        let refused = check_images_inside(dir.path()).unwrap_err();
        assert!(refused.contains("external"), "{refused}");
    }

    #[test]
    fn a_downloaded_template_json_must_stay_in_its_folder_and_name_itself() {
        let dir = tempfile::tempdir().unwrap();
        let write = |json: serde_json::Value| {
            std::fs::write(dir.path().join("template.json"), json.to_string()).unwrap();
        };
        write(
            serde_json::json!({"name": "t", "kernel": "vmlinux", "initramfs": "initramfs.cpio", "disk": null, "snapshot": "snapshot"}),
        );
        check_template_manifest(dir.path(), "t").unwrap();
        assert!(check_template_manifest(dir.path(), "other").is_err());
        for (key, bad) in [
            ("snapshot", "/var/lib/x"),
            ("kernel", "../vmlinux"),
            ("disk", "a/../../b"),
            ("initramfs", ""),
        ] {
            write(serde_json::json!({"name": "t", key: bad}));
            assert!(
                check_template_manifest(dir.path(), "t").is_err(),
                "{key} {bad}"
            );
        }
        write(serde_json::json!({"name": "../../x"}));
        assert!(check_template_manifest(dir.path(), "t").is_err());
    }

    #[test]
    fn images_are_told_apart_by_their_magic() {
        let dir = tempfile::tempdir().unwrap();
        let qcow2 = dir.path().join("a.qcow2");
        std::fs::write(&qcow2, b"QFI\xfb\0\0\0\x03rest").unwrap();
        let raw = dir.path().join("a.ext4");
        std::fs::write(&raw, [0u8; 16]).unwrap();
        assert_eq!(image_format(&qcow2), "qcow2");
        assert_eq!(image_format(&raw), "raw");
        assert_eq!(image_format(&dir.path().join("missing")), "raw");
    }
}
