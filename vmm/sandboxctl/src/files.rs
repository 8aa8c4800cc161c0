//! File commands: `put`, `get`, `cat`, `write`, `ls`, `stat`, `rm`, `mkdir`.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use sandbox_vmm::client::{Client, ClientError};
use serde::Serialize;

use crate::args::{GetArgs, LsArgs, MkdirArgs, PutArgs, RmArgs, StatArgs, WriteArgs};
use crate::output::{self, print_json_line, OutputError};

fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Receives the remote file beside `args.local` under a fresh temporary name, then
/// renames it into place, so a failed get leaves nothing half-written.
///
/// The mode is the guest's as `cp` without `-p` takes it: permission bits only,
/// never setuid, setgid or sticky, and masked by our umask. The guest is untrusted;
/// a root `sandboxctl` must not turn its files into setuid executables on the host.
async fn get_into_new_file(client: &Client, args: &GetArgs) -> anyhow::Result<(u64, u32)> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = args
        .local
        .file_name()
        .context("the local path has no file name")?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.part", std::process::id()));
    let temp = args.local.with_file_name(temp_name);
    // New and not through a link: nobody else's file is ever written or truncated.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .with_context(|| format!("Cannot create {}", temp.display()))?;
    let finish = async {
        let (bytes, mode) = client
            .get(&args.remote, tokio::fs::File::from_std(file))
            .await?;
        let mode = mode & 0o777 & !current_umask();
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("Cannot set the mode of {}", temp.display()))?;
        std::fs::rename(&temp, &args.local)
            .with_context(|| format!("Cannot rename into {}", args.local.display()))?;
        anyhow::Ok((bytes, mode))
    };
    let result = finish.await;
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// This process's umask (read by setting it and putting it back; nothing else in
/// `sandboxctl` creates files concurrently).
fn current_umask() -> u32 {
    let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    nix::sys::stat::umask(mask);
    mask.bits()
}

/// What `path` is when it exists and is neither a regular file nor a directory.
fn special_file(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let file_type = std::fs::metadata(path).ok()?.file_type();
    if file_type.is_file() || file_type.is_dir() {
        None
    } else if file_type.is_fifo() {
        Some("FIFO")
    } else if file_type.is_socket() {
        Some("socket")
    } else {
        Some("device")
    }
}

fn rate(bytes: u64, started: Instant) -> String {
    let secs = started.elapsed().as_secs_f64();
    format!(
        "{bytes} bytes in {secs:.2}s ({:.0} MiB/s)",
        bytes as f64 / 1048576.0 / secs.max(1e-9)
    )
}

pub(crate) async fn put(client: &Client, args: &PutArgs) -> anyhow::Result<u8> {
    let started = Instant::now();
    let (bytes, mode) = if is_stdio(&args.local) {
        client
            .put(&args.remote, args.mode, tokio::io::stdin())
            .await
    } else {
        let file = tokio::fs::File::open(&args.local)
            .await
            .with_context(|| format!("Cannot open {}", args.local.display()))?;
        let local_mode = file
            .metadata()
            .await
            .ok()
            .map(|m| m.permissions().mode() & 0o7777);
        client
            .put(&args.remote, args.mode.or(local_mode), file)
            .await
    }
    .with_context(|| format!("put {} failed", args.remote.display()))?;
    eprintln!("{} (mode {mode:o})", rate(bytes, started));
    Ok(0)
}

pub(crate) async fn get(client: &Client, args: &GetArgs) -> anyhow::Result<u8> {
    let started = Instant::now();
    let what = || format!("get {} failed", args.remote.display());
    let (bytes, _) = if is_stdio(&args.local) {
        match client.get(&args.remote, tokio::io::stdout()).await {
            Ok(done) => done,
            // Writing to our stdout is the only local I/O here: a reader that went
            // away (`get FILE - | head`) ends the run quietly.
            Err(ClientError::Local { error, .. }) => return Err(OutputError::Stdout(error).into()),
            Err(error) => return Err(error).with_context(what),
        }
    } else if let Some(kind) = special_file(&args.local) {
        // A device, FIFO or socket is written into, as `cp` does: renaming a file
        // over it would destroy it (`get FILE /dev/null` would replace /dev/null).
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .open(&args.local)
            .await
            .with_context(|| format!("Cannot open the {kind} {}", args.local.display()))?;
        client.get(&args.remote, file).await.with_context(what)?
    } else {
        get_into_new_file(client, args).await.with_context(what)?
    };
    eprintln!("{}", rate(bytes, started));
    Ok(0)
}

pub(crate) async fn cat(client: &Client, path: &Path) -> anyhow::Result<u8> {
    let data = client
        .read_file(path)
        .await
        .with_context(|| format!("cat {} failed", path.display()))?;
    output::stdout(&data)?;
    Ok(0)
}

pub(crate) async fn write(client: &Client, args: &WriteArgs) -> anyhow::Result<u8> {
    client
        .put(&args.path, args.mode, tokio::io::stdin())
        .await
        .with_context(|| format!("write {} failed", args.path.display()))?;
    Ok(0)
}

#[derive(Serialize)]
struct EntryView {
    name: String,
    kind: &'static str,
    size: u64,
}

pub(crate) async fn ls(client: &Client, args: &LsArgs) -> anyhow::Result<u8> {
    let entries = client
        .list_dir(&args.path)
        .await
        .with_context(|| format!("ls {} failed", args.path.display()))?;
    if args.json {
        let views: Vec<_> = entries
            .iter()
            .map(|e| EntryView {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                kind: e.kind.as_str(),
                size: e.size,
            })
            .collect();
        print_json_line(&views)?;
        return Ok(0);
    }
    let mut listing = Vec::new();
    for entry in entries {
        // Writing into a Vec cannot fail.
        let _ = write!(listing, "{:<8}{:>12}  ", entry.kind.as_str(), entry.size);
        // Names go out as raw bytes: a name that is not UTF-8 stays what it is.
        listing.extend_from_slice(&entry.name);
        listing.push(b'\n');
    }
    output::stdout(&listing)?;
    Ok(0)
}

#[derive(Serialize)]
struct StatView {
    kind: &'static str,
    size: u64,
    mode: String,
    uid: u32,
    gid: u32,
    modified_ms: i64,
    symlink_target: Option<String>,
}

pub(crate) async fn stat(client: &Client, args: &StatArgs) -> anyhow::Result<u8> {
    let stat = client
        .stat(&args.path)
        .await
        .with_context(|| format!("stat {} failed", args.path.display()))?;
    let view = StatView {
        kind: stat.kind.as_str(),
        size: stat.size,
        mode: format!("{:04o}", stat.mode),
        uid: stat.uid,
        gid: stat.gid,
        modified_ms: stat.modified_ms,
        symlink_target: stat
            .symlink_target
            .as_deref()
            .map(|t| String::from_utf8_lossy(t).into_owned()),
    };
    if args.json {
        print_json_line(&view)?;
    } else {
        output::print(&human_stat(&view))?;
    }
    Ok(0)
}

/// `stat` as `key  value` lines.
fn human_stat(view: &StatView) -> String {
    let mut text = format!(
        "kind      {}\nsize      {}\nmode      {}\nowner     {}:{}\nmodified  {} ms since the epoch\n",
        view.kind, view.size, view.mode, view.uid, view.gid, view.modified_ms
    );
    if let Some(target) = &view.symlink_target {
        text.push_str(&format!("target    {target}\n"));
    }
    text
}

pub(crate) async fn rm(client: &Client, args: &RmArgs) -> anyhow::Result<u8> {
    client
        .remove(&args.path, args.recursive)
        .await
        .with_context(|| format!("rm {} failed", args.path.display()))?;
    Ok(0)
}

pub(crate) async fn mkdir(client: &Client, args: &MkdirArgs) -> anyhow::Result<u8> {
    client
        .mkdir(&args.path, args.parents, args.mode)
        .await
        .with_context(|| format!("mkdir {} failed", args.path.display()))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_is_a_dash() {
        assert!(is_stdio(Path::new("-")));
        assert!(!is_stdio(Path::new("./-x")));
    }
}
