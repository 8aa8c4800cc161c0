//! Running `sandbox-rootfs`: `reference` to describe a claim's reference, `build`
//! to make its template, with the builder's progress turned into short lines.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::Command;

use super::{BuildProgress, ImageBuildError, RegistryPolicy};

/// Log lines of a failed build quoted in its error.
pub const BUILD_LOG_TAIL_LINES: usize = 8;

/// Longest line read from the builder; longer ones are cut (a line is a log event
/// or a progress object, a few hundred bytes).
pub const BUILDER_LINE_MAX_BYTES: usize = 4096;

/// A reference as `sandbox-rootfs reference` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Described {
    /// Fully qualified, `oci://…`, as the template records it.
    pub reference: String,
    /// The registry as written (`docker.io`).
    pub registry: String,
    /// The registry as dialled (`index.docker.io`, `127.0.0.1:5000`).
    pub host: String,
    /// The template name a claim of it gets.
    pub template: String,
}

/// One download report of `sandbox-rootfs build --progress json`.
#[derive(Debug, Deserialize)]
struct Download {
    what: String,
    done: u64,
    total: u64,
}

/// Longest claim template read as a reference (the distribution spec caps a
/// repository name at 255 characters; a tag at 128, a digest at 71 plus the host).
pub const REFERENCE_MAX_CHARS: usize = 512;

/// Asks the builder what `text` is.
pub async fn describe(program: &Path, text: &str) -> Result<Described, ImageBuildError> {
    if text.len() > REFERENCE_MAX_CHARS {
        return Err(ImageBuildError::Reference {
            text: text.chars().take(64).collect::<String>() + "…",
            reason: format!("longer than {REFERENCE_MAX_CHARS} characters"),
        });
    }
    let output = Command::new(program)
        // `--`: a claim's text is never read as one of the builder's flags.
        .args(["reference", "--", text])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| ImageBuildError::Spawn {
            program: program.to_owned(),
            error,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reason = stderr
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("sandbox-rootfs: ")
            .to_owned();
        return Err(ImageBuildError::Reference {
            text: text.to_owned(),
            reason,
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).map_err(|_| ImageBuildError::Output {
        text: text.to_owned(),
        output: stdout.chars().take(200).collect(),
    })
}

/// Builds `image`'s template into `home`, reporting downloads and the build's
/// steps to `progress`.
pub async fn build(
    policy: &RegistryPolicy,
    home: &Path,
    image: &Described,
    progress: Option<&BuildProgress>,
) -> Result<(), ImageBuildError> {
    let mut command = Command::new(&policy.builder);
    command
        .args([
            "build",
            "--name",
            &image.template,
            "--base",
            &image.reference,
        ])
        .args(["--progress", "json"])
        .env("SANDBOX_HOME", home)
        .env("SANDBOX_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A claim given up (its client went away) ends its build.
        .kill_on_drop(true);
    for host in &policy.insecure {
        command.args(["--insecure-registry", host]);
    }
    let spawn_failed = |error| ImageBuildError::Spawn {
        program: policy.builder.clone(),
        error,
    };
    let mut child = command.spawn().map_err(spawn_failed)?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(spawn_failed(std::io::Error::other("no output pipes")));
    };
    let downloads = read_lines(stdout, |line| {
        if let (Some(progress), Ok(download)) = (progress, serde_json::from_str::<Download>(line)) {
            progress.report(&download_line(&image.reference, &download));
        }
    });
    let mut tail = VecDeque::with_capacity(BUILD_LOG_TAIL_LINES);
    let log = read_lines(stderr, |line| {
        let message = log_message(line);
        if message.is_empty() {
            return;
        }
        if let Some(progress) = progress {
            progress.report(&format!("building {}: {message}", image.template));
        }
        if tail.len() == BUILD_LOG_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(message.to_owned());
    });
    let ((), (), status) = tokio::join!(downloads, log, child.wait());
    let status = status.map_err(spawn_failed)?;
    if status.success() {
        return Ok(());
    }
    Err(ImageBuildError::Build {
        reference: image.reference.clone(),
        command: policy.build_command(image),
        log: Vec::from(tail).join(" | "),
    })
}

/// Calls `each` with every line of `reader` (lossy UTF-8, cut at
/// [`BUILDER_LINE_MAX_BYTES`]) until it ends or fails.
async fn read_lines(reader: impl AsyncRead + Unpin, mut each: impl FnMut(&str)) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                line.truncate(BUILDER_LINE_MAX_BYTES);
                each(String::from_utf8_lossy(&line).trim_end());
            }
        }
    }
}

/// A download report as one line: `pulling oci://… layer 1/3: 4.0 of 12.5 MiB`.
fn download_line(reference: &str, download: &Download) -> String {
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    format!(
        "pulling {reference} {}: {:.1} of {:.1} MiB",
        download.what,
        mib(download.done),
        mib(download.total)
    )
}

/// The event of one of the builder's log lines, without its timestamp and level
/// (`2026-…Z  INFO step="2/5" kernel` is `step="2/5" kernel`); other lines as they are.
fn log_message(line: &str) -> &str {
    for level in [" INFO ", " WARN ", " ERROR ", " DEBUG ", " TRACE "] {
        if let Some((_, message)) = line.split_once(level) {
            return message.trim();
        }
    }
    line.trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_overlong_reference_is_refused_without_running_the_builder() {
        let text = format!("oci://h/{}:v", "a".repeat(REFERENCE_MAX_CHARS));
        let error = describe(Path::new("/nonexistent/sandbox-rootfs"), &text)
            .await
            .unwrap_err();
        assert!(
            matches!(error, ImageBuildError::Reference { .. }),
            "{error}"
        );
    }

    #[test]
    fn log_lines_lose_their_timestamp_and_level() {
        assert_eq!(
            log_message(r#"2026-12-02T06:20:00.123456Z  INFO step="2/5" kernel"#),
            r#"step="2/5" kernel"#
        );
        assert_eq!(log_message("sandbox-rootfs: boom"), "sandbox-rootfs: boom");
        assert_eq!(log_message("   "), "");
    }

    #[test]
    fn downloads_read_as_mib_of_a_layer() {
        let download = Download {
            what: "layer 1/2".into(),
            done: 3 << 20,
            total: 12 << 20,
        };
        assert_eq!(
            download_line("oci://h/r:v", &download),
            "pulling oci://h/r:v layer 1/2: 3.0 of 12.0 MiB"
        );
    }
}
