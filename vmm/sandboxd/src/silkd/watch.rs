//! `fs_watch`: filesystem events under a path, streamed until the client hangs up.
//!
//! Our agent has no event stream for a tree (its inotify serves `wait_for_text`
//! on one file), so the node polls: a snapshot of the tree (the agent's `list_dir`,
//! plus `stat` for each entry's mtime) every [`WATCH_POLL_MS`], diffed against the
//! last one. The first snapshot is taken before `ready` is sent, so every change
//! after `ready` is reported: `created`, `deleted`, or `modified` (size or mtime
//! changed). Changes that undo themselves within one poll are not seen, and a
//! rename shows as `deleted` + `created`.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_protocol::FileKind;
use sandbox_vmm::client::Client;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::files::guest_path;
use super::frames::{EventKind, Response};
use super::{AgentSource, ErrorKind, OpError};

/// Time between two snapshots.
pub const WATCH_POLL_MS: u64 = 200;

/// The most entries one watch tracks.
pub const WATCH_ENTRY_CAP: usize = 4096;

/// What a path looked like at one poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    kind: FileKind,
    size: u64,
    modified_ms: i64,
}

type Snapshot = BTreeMap<String, Seen>;

async fn snapshot(client: &Client, root: &str, recursive: bool) -> Result<Snapshot, OpError> {
    let mut seen = Snapshot::new();
    let mut dirs = vec![root.trim_end_matches('/').to_owned()];
    while let Some(dir) = dirs.pop() {
        let listing = match client
            .list_dir(if dir.is_empty() { "/" } else { &dir })
            .await
        {
            Ok(listing) => listing,
            Err(_) if !seen.is_empty() || dir != root.trim_end_matches('/') => continue,
            Err(error) => return Err(OpError::agent("watch", &error)),
        };
        for entry in listing {
            if seen.len() >= WATCH_ENTRY_CAP {
                return Ok(seen);
            }
            let path = format!("{dir}/{}", String::from_utf8_lossy(&entry.name));
            let modified_ms = match client.stat(&path).await {
                Ok(stat) => stat.modified_ms,
                Err(_) => continue,
            };
            if recursive && entry.kind == FileKind::Dir {
                dirs.push(path.clone());
            }
            seen.insert(
                path,
                Seen {
                    kind: entry.kind,
                    size: entry.size,
                    modified_ms,
                },
            );
        }
    }
    Ok(seen)
}

/// The events that turn `before` into `after`, in path order.
fn diff(before: &Snapshot, after: &Snapshot) -> Vec<(EventKind, String)> {
    let mut events = Vec::new();
    for (path, now) in after {
        match before.get(path) {
            None => events.push((EventKind::Created, path.clone())),
            Some(then) if then != now => events.push((EventKind::Modified, path.clone())),
            Some(_) => {}
        }
    }
    for path in before.keys() {
        if !after.contains_key(path) {
            events.push((EventKind::Deleted, path.clone()));
        }
    }
    events
}

pub async fn watch<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    path: &str,
    recursive: bool,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let root = guest_path(path)?;
    let client = conn.client().await?;
    let stat = client
        .stat(root)
        .await
        .map_err(|error| OpError::agent("watch", &error))?;
    if stat.kind != FileKind::Dir {
        return Err(OpError::reply(
            ErrorKind::BadRequest,
            format!("watch: {root} is not a directory"),
        ));
    }
    let mut last = snapshot(&client, root, recursive).await?;
    conn.send(&Response::Ready).await?;
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(WATCH_POLL_MS)) => {}
            spoke = conn.client_spoke() => {
                spoke?;
                if conn.client_gone().await? {
                    return Ok(());
                }
                continue;
            }
        }
        // A sandbox hibernated under a watch wakes for it; a failed poll ends the watch.
        let client = conn.client().await?;
        let now = match snapshot(&client, root, recursive).await {
            Ok(now) => now,
            Err(error) => return Err(error),
        };
        for (kind, path) in diff(&last, &now) {
            conn.send(&Response::Event { kind, path }).await?;
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(size: u64, modified_ms: i64) -> Seen {
        Seen {
            kind: FileKind::File,
            size,
            modified_ms,
        }
    }

    #[test]
    fn a_diff_reports_created_modified_and_deleted_paths() {
        let before = Snapshot::from([("/w/a".into(), seen(1, 1)), ("/w/b".into(), seen(1, 1))]);
        let after = Snapshot::from([("/w/a".into(), seen(2, 1)), ("/w/c".into(), seen(1, 1))]);
        assert_eq!(
            diff(&before, &after),
            vec![
                (EventKind::Modified, "/w/a".to_owned()),
                (EventKind::Created, "/w/c".to_owned()),
                (EventKind::Deleted, "/w/b".to_owned()),
            ]
        );
        assert!(diff(&after, &after).is_empty());
    }
}
