//! `fs_find` and `fs_replace` with Rust regexes, as seed 000's daemon evaluates
//! them, on the node: the tree is walked with the agent's `list_dir`, files are read
//! with `get` and rewritten with the atomic `put`. A pattern is data, never a shell
//! word.
//!
//! Bounds: files over [`SEARCH_FILE_CAP_BYTES`] are skipped (as seed 000 does), a
//! walk stops after [`SEARCH_ENTRY_CAP`] entries, and a find ends as soon as the
//! client hangs up.

use regex::{Captures, Regex};
use sandbox_protocol::FileKind;
use sandbox_vmm::client::Client;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Conn;
use super::files::guest_path;
use super::frames::Response;
use super::{AgentSource, ErrorKind, OpError};

/// Files larger than this are not searched.
pub const SEARCH_FILE_CAP_BYTES: u64 = 8 * 1024 * 1024;

/// The most directory entries one find visits.
pub const SEARCH_ENTRY_CAP: usize = 100_000;

fn compile(pattern: &str) -> Result<Regex, OpError> {
    Regex::new(pattern).map_err(|error| OpError::bad_request(error.to_string()))
}

/// A `*`/`?` glob as an anchored regex over a file name.
fn glob_regex(glob: &str) -> Result<Regex, OpError> {
    let pattern = regex::escape(glob).replace(r"\*", ".*").replace(r"\?", ".");
    compile(&format!("^{pattern}$"))
}

/// A whole guest file (searches read files up to the cap).
async fn read_all(client: &Client, path: &str) -> Result<Vec<u8>, OpError> {
    let mut data = Vec::new();
    client
        .get(path, &mut data)
        .await
        .map_err(|error| OpError::agent("read", &error))?;
    Ok(data)
}

pub async fn find<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    path: &str,
    pattern: &str,
    glob: Option<&str>,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let root = guest_path(path)?.trim_end_matches('/').to_owned();
    let pattern = compile(pattern)?;
    let names = glob
        .filter(|glob| !glob.is_empty())
        .map(glob_regex)
        .transpose()?;
    let client = conn.client().await?;
    let root_stat = client
        .stat(if root.is_empty() { "/" } else { &root })
        .await
        .map_err(|error| OpError::agent("find", &error))?;
    let mut files = Vec::new();
    if root_stat.kind == FileKind::File {
        files.push((root.clone(), root_stat.size));
    }
    let mut dirs = if root_stat.kind == FileKind::Dir {
        vec![root]
    } else {
        Vec::new()
    };
    let mut visited = 0usize;
    while let Some(dir) = dirs.pop() {
        let listing = match client
            .list_dir(if dir.is_empty() { "/" } else { &dir })
            .await
        {
            Ok(listing) => listing,
            // A directory that went away or refuses us is skipped, as below the root.
            Err(_) => continue,
        };
        for entry in listing {
            visited += 1;
            if visited > SEARCH_ENTRY_CAP {
                return Err(OpError::bad_request(format!(
                    "find visits at most {SEARCH_ENTRY_CAP} entries; narrow the path"
                )));
            }
            let name = String::from_utf8_lossy(&entry.name).into_owned();
            let full = format!("{dir}/{name}");
            match entry.kind {
                FileKind::Dir => dirs.push(full),
                FileKind::File if names.as_ref().is_none_or(|re| re.is_match(&name)) => {
                    files.push((full, entry.size));
                }
                _ => {}
            }
        }
    }
    for (file, size) in files {
        if size > SEARCH_FILE_CAP_BYTES {
            continue;
        }
        let Ok(data) = read_all(&client, &file).await else {
            continue;
        };
        let Ok(text) = String::from_utf8(data) else {
            continue;
        };
        for (at, line) in text.lines().enumerate() {
            if pattern.is_match(line) {
                conn.send(&Response::Match {
                    file: file.clone(),
                    line: at as u64 + 1,
                    content: line.to_owned(),
                })
                .await?;
            }
        }
    }
    conn.send(&Response::Done).await
}

pub async fn replace<S, R, W>(
    conn: &mut Conn<'_, S, R, W>,
    files: &[String],
    pattern: &str,
    replacement: &str,
) -> Result<(), OpError>
where
    S: AgentSource,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let pattern = compile(pattern)?;
    let client = conn.client().await?;
    for file in files {
        let path = guest_path(file)?;
        let stat = client
            .stat(path)
            .await
            .map_err(|error| OpError::agent("replace", &error))?;
        let mut count = 0u64;
        if stat.size <= SEARCH_FILE_CAP_BYTES {
            let data = read_all(&client, path).await?;
            let text = String::from_utf8(data).map_err(|_| {
                OpError::reply(
                    ErrorKind::BadRequest,
                    format!("replace: {path} is not UTF-8"),
                )
            })?;
            let replaced = pattern.replace_all(&text, |caps: &Captures<'_>| {
                count += 1;
                let mut out = String::new();
                caps.expand(replacement, &mut out);
                out
            });
            if count > 0 {
                client
                    .put(path, None, replaced.as_bytes())
                    .await
                    .map_err(|error| OpError::agent("replace", &error))?;
            }
        }
        conn.send(&Response::Replaced {
            file: file.clone(),
            replacements: count,
        })
        .await?;
    }
    conn.send(&Response::Done).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::glob_regex;

    #[test]
    fn a_glob_matches_whole_names_only() {
        let re = glob_regex("*.py").unwrap();
        assert!(re.is_match("a.py"));
        assert!(!re.is_match("a.pyc"));
        assert!(glob_regex("a?c").unwrap().is_match("abc"));
        assert!(!glob_regex("a.c").unwrap().is_match("abc"));
    }
}
