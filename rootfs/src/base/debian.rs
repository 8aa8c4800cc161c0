//! A minimal Debian base from `mmdebstrap` (variant `minbase`), with extra packages
//! (`--packages python3,python3-pip`), cached as a tarball.
//!
//! mmdebstrap needs no root (it uses user namespaces when unprivileged). It writes
//! one tarball into `<cache>/debian/<suite>-<key>.tar`, where the key is a hash of
//! what decides the result: the suite, the sorted package list and the bootstrap
//! options ([`BOOTSTRAP_OPTIONS`]). A later build with the same inputs unpacks that
//! tarball (seconds) instead of bootstrapping again (minutes): packages are not
//! re-resolved against the mirror, so `--refresh-base` bootstraps anew, to pick up
//! what Debian has updated since. The tarball is written under a temporary name
//! and renamed when complete, so an interrupted bootstrap leaves nothing usable.
//!
//! The result is usually too large for an initramfs and goes to a disk.

use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use tracing::info;

use super::image::unpack_files;
use super::BaseError;
use crate::cmd;

/// The suite used when none is named, on a host that is not Debian.
pub const FALLBACK_SUITE: &str = "stable";

/// Where a Debian host names its release.
const OS_RELEASE_PATH: &str = "/etc/os-release";

/// How a bootstrap's tarball is named until it is complete.
const PARTIAL_PREFIX: &str = ".partial-";

/// A partial tarball this old belongs to a build that was killed.
const PARTIAL_ABANDONED_SECS: u64 = 3600;

/// mmdebstrap options every Debian base is made with; part of the cache key.
///
/// - `force-unsafe-io`: dpkg skips its fsync per file, which made most of the
///   bootstrap's time here (the result is a tarball written at the end; a crash
///   mid-way leaves nothing to trust anyway).
/// - no manual pages, info pages, translations or documentation except the
///   copyright files (as Debian's `-slim` container images): 45 MiB less in a
///   Python base, nothing a sandbox uses.
pub const BOOTSTRAP_OPTIONS: [&str; 8] = [
    "--variant=minbase",
    "--format=tar",
    "--dpkgopt=force-unsafe-io",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
];

/// What a Debian base is made of besides its suite.
#[derive(Debug, Clone, Default)]
pub struct DebianOptions {
    /// Packages installed on top of `minbase` (with their dependencies, without
    /// recommends).
    pub packages: Vec<String>,
    /// Where bootstrapped bases are kept (`<cache>/debian`).
    pub cache_dir: PathBuf,
    /// Bootstrap again even when a cached base matches.
    pub refresh: bool,
}

/// Bootstraps Debian `suite` (by default the host's release) with `options` into
/// `staging`, or unpacks the cached result of an earlier bootstrap.
pub fn install(
    suite: Option<&str>,
    options: &DebianOptions,
    staging: &Path,
) -> Result<(), BaseError> {
    let host = fs::read_to_string(OS_RELEASE_PATH)
        .ok()
        .and_then(|text| host_debian_release(&text));
    let suite = suite.or(host.as_deref()).unwrap_or(FALLBACK_SUITE);
    check_packages(&options.packages)?;
    let mut packages = options.packages.clone();
    packages.sort();
    packages.dedup();
    // The suite is the user's word: only plain characters of it reach a file name.
    let label: String = suite
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cached = options
        .cache_dir
        .join(format!("{label}-{:016x}.tar", cache_key(suite, &packages)));
    match fs::metadata(&cached) {
        Ok(meta) if !options.refresh => {
            let age_days = meta
                .modified()
                .ok()
                .and_then(|at| SystemTime::now().duration_since(at).ok())
                .map_or(0, |age| age.as_secs() / 86_400);
            info!(
                suite,
                packages = packages.join(","),
                age_days,
                tarball = %cached.display(),
                "Debian base from the cache (--refresh-base bootstraps it again)"
            );
        }
        _ => bootstrap(suite, &packages, &cached)?,
    }
    let read_error = |error| BaseError::Unpack {
        path: cached.clone(),
        error,
    };
    let tarball = File::open(&cached).map_err(read_error)?;
    let skipped = unpack_files(Box::new(BufReader::new(tarball)), staging).map_err(read_error)?;
    info!(skipped, "Debian base unpacked (device nodes skipped)");
    Ok(())
}

/// Runs mmdebstrap into `tarball`, through a temporary file renamed at the end.
fn bootstrap(suite: &str, packages: &[String], tarball: &Path) -> Result<(), BaseError> {
    let dir = tarball.parent().unwrap_or(Path::new("."));
    crate::tree::make_dir(dir, 0o755)?;
    remove_abandoned_partials(dir);
    let partial = dir.join(format!("{PARTIAL_PREFIX}{}.tar", std::process::id()));
    info!(
        suite,
        packages = packages.join(","),
        "bootstrapping Debian with mmdebstrap (a few minutes)"
    );
    let mut command = Command::new("mmdebstrap");
    command.arg("--quiet").args(BOOTSTRAP_OPTIONS);
    if !packages.is_empty() {
        command.arg(format!("--include={}", packages.join(",")));
    }
    let result = cmd::run_visible(command.arg(suite).arg(&partial));
    if let Err(error) = result {
        let _ = fs::remove_file(&partial);
        return Err(error.into());
    }
    fs::rename(&partial, tarball).map_err(|error| crate::tree::TreeError {
        op: "rename",
        path: partial.clone(),
        error,
    })?;
    Ok(())
}

/// Removes what killed builds left: partial tarballs untouched for
/// [`PARTIAL_ABANDONED_SECS`] (mmdebstrap writes its tarball in its last seconds,
/// so a live build's is minutes old at most). Best effort.
fn remove_abandoned_partials(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let abandoned = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|age| age.as_secs() > PARTIAL_ABANDONED_SECS);
        if abandoned
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_PREFIX)
        {
            info!(path = %entry.path().display(), "removing an abandoned partial bootstrap");
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Fails on the first name Debian would not allow.
pub fn check_packages(packages: &[String]) -> Result<(), BaseError> {
    match packages.iter().find(|p| !valid_package_name(p)) {
        Some(bad) => Err(BaseError::PackageName { name: bad.clone() }),
        None => Ok(()),
    }
}

/// A Debian package name as policy allows it: lowercase letters, digits, `+`, `-`
/// and `.`, at least two, starting with a letter or digit (so never an option).
fn valid_package_name(name: &str) -> bool {
    name.len() >= 2
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        })
}

/// FNV-1a (64 bits) of everything that decides a bootstrap's result. Stable across
/// builds and Rust versions, unlike `std`'s hasher; collisions do not matter at
/// this scale.
fn cache_key(suite: &str, sorted_packages: &[String]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = std::iter::once(suite)
        .chain(BOOTSTRAP_OPTIONS)
        .chain(sorted_packages.iter().map(String::as_str));
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// `VERSION_CODENAME` from an os-release file, when it describes Debian.
fn host_debian_release(os_release: &str) -> Option<String> {
    let field = |name: &str| {
        os_release.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix('=')?;
            Some(value.trim_matches('"').to_owned())
        })
    };
    (field("ID").as_deref() == Some("debian"))
        .then(|| field("VERSION_CODENAME"))
        .flatten()
        .filter(|codename| !codename.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_release_comes_from_os_release_on_debian_only() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n";
        assert_eq!(host_debian_release(debian).as_deref(), Some("bookworm"));
        let ubuntu = "ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n";
        assert_eq!(host_debian_release(ubuntu), None);
    }

    #[test]
    fn package_names_follow_debian_policy() {
        for good in ["python3", "python3-pip", "libstdc++6", "g++", "0ad"] {
            assert!(valid_package_name(good), "{good}");
        }
        for bad in [
            "",
            "a",
            "-o",
            "Python3",
            "pkg=1.0",
            "a,b",
            "a b",
            "pkg/bookworm",
        ] {
            assert!(!valid_package_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_cache_key_changes_with_each_input_only() {
        let pkgs = |list: &[&str]| list.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        let python = cache_key("bookworm", &pkgs(&["python3", "python3-pip"]));
        assert_eq!(
            python,
            cache_key("bookworm", &pkgs(&["python3", "python3-pip"]))
        );
        assert_ne!(
            python,
            cache_key("trixie", &pkgs(&["python3", "python3-pip"]))
        );
        assert_ne!(python, cache_key("bookworm", &pkgs(&["python3"])));
        // The separators keep `a` + `bc` apart from `ab` + `c`.
        assert_ne!(
            cache_key("bookworm", &pkgs(&["ab", "cd"])),
            cache_key("bookworm", &pkgs(&["abc", "d"]))
        );
    }

    #[test]
    fn a_cached_base_is_unpacked_without_mmdebstrap() {
        // A tarball as mmdebstrap writes it: the root as `./`, a device node, files.
        let cache = tempfile::tempdir().unwrap();
        let packages = vec!["python3".to_owned()];
        let key = cache_key("bookworm", &packages);
        let tarball = cache.path().join(format!("bookworm-{key:016x}.tar"));
        let mut builder = tar::Builder::new(File::create(&tarball).unwrap());
        let mut entry = |path: &str, kind: tar::EntryType, data: &[u8], mode: u32| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(data.len() as u64);
            header.set_mode(mode);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            builder.append_data(&mut header, path, data).unwrap();
        };
        entry("./", tar::EntryType::Directory, b"", 0o755);
        entry("./dev/", tar::EntryType::Directory, b"", 0o755);
        entry("./dev/null", tar::EntryType::Char, b"", 0o666);
        entry("./usr/bin/", tar::EntryType::Directory, b"", 0o755);
        entry(
            "./usr/bin/python3",
            tar::EntryType::Regular,
            b"#!python",
            0o755,
        );
        builder.into_inner().unwrap();

        let staging = tempfile::tempdir().unwrap();
        let options = DebianOptions {
            packages,
            cache_dir: cache.path().to_owned(),
            refresh: false,
        };
        install(Some("bookworm"), &options, staging.path()).unwrap();
        assert_eq!(
            fs::read(staging.path().join("usr/bin/python3")).unwrap(),
            b"#!python"
        );
        assert!(!staging.path().join("dev/null").exists());
    }

    #[test]
    fn bad_package_names_are_refused_before_anything_runs() {
        let options = DebianOptions {
            packages: vec!["--root".into()],
            cache_dir: PathBuf::from("/nonexistent"),
            refresh: false,
        };
        let staging = tempfile::tempdir().unwrap();
        let error = install(Some("bookworm"), &options, staging.path()).unwrap_err();
        assert!(matches!(error, BaseError::PackageName { .. }), "{error}");
    }
}
