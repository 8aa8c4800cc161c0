//! Starting children: from a [`ProcessSpec`] to a running, tracked process.
//!
//! Every child gets a clean environment (below), its own cgroup when the agent
//! confines in cgroups (born in it, see [`super::cgroup`]), its own process group
//! (exec, spawn) or its own session with the terminal as controlling tty (pty), the
//! default OOM score instead of the agent's shield (reset by a cloned child itself,
//! else lowered for the start under the spawn gate, see [`super::gate`]), and the
//! requested user. An interpreter session's child also gets `SIGINT` and `SIGQUIT`
//! back at their default action (see [`crate::session`]). Everything that reads
//! files or allocates (the passwd entry, supplementary groups, the C strings of
//! argv and the environment, the pipes) happens before the child exists; the child
//! only makes async-signal-safe calls (see [`crate::sys`]).
//!
//! # How a child starts
//! With cgroups, `clone3` into the cgroup, sharing the agent's memory until `exec`
//! ([`crate::sys::spawn`]): about what `posix_spawn` costs, with the cgroup for
//! free. Without cgroups, std's `Command`, which uses `posix_spawn` unless a
//! terminal, a user switch or a session's signals need steps in the child, then
//! `fork`. A kernel older than 5.7 (no `CLONE_INTO_CGROUP`) gets the fork, with the
//! child joining its cgroup before `exec`.
//!
//! # Default environment
//! `PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`, `HOME`, `USER`,
//! `LOGNAME` and `SHELL` from the user's passwd entry (`/root`, `root`, `/bin/sh` when
//! there is none), `LANG=C.UTF-8`, and `TERM=xterm-256color` for terminals or
//! `TERM=dumb` for pipes. The template's variables ([`super::defaults`]) are applied
//! after, then the request's `env` entries, in order. The working directory defaults
//! to the template's, else `HOME` when it exists, else `/`; the user to the
//! template's, else the agent's own.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::unistd::{Gid, Uid, User as PasswdUser};
use sandbox_protocol::{Pid, ProcessKind, ProcessSpec, User};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use super::cgroup::{CgroupTree, Confinement, NewCgroup};
use super::defaults::ProcessDefaults;
use super::gate::SpawnPermit;
use super::table::{Capture, ProcessRecord, ProcessTable};
use super::ProcessError;
use crate::sys::spawn::{ChildImage, ChildSession, CloneError};
use crate::sys::{self, ChildUser, PreExec};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything needed to start a child, resolved before `fork`.
#[derive(Debug)]
pub struct LaunchPlan {
    argv: Vec<String>,
    /// `argv[0]` as the child sees it, when it differs (`-sh` for a login shell).
    arg0: Option<String>,
    env: Vec<(String, String)>,
    cwd: String,
    identity: Option<ChildUser>,
}

impl LaunchPlan {
    /// What `ps` shows.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
}

/// Resolves `spec` into a plan, with `defaults` for what it leaves out. `terminal`
/// selects the pty defaults.
pub fn plan(
    spec: &ProcessSpec,
    terminal: bool,
    defaults: &ProcessDefaults,
) -> Result<LaunchPlan, ProcessError> {
    // The request's user, else the template's (with its group), else the agent's own.
    let (user, group) = match (&spec.user, &defaults.user) {
        (Some(user), _) => (Some(user), None),
        (None, Some(default)) => (Some(&default.user), default.group.as_ref()),
        (None, None) => (None, None),
    };
    let gid = group.map(|group| group.gid()).transpose()?;
    let passwd = match user {
        None => super::passwd::own_entry(),
        Some(user) => Some(lookup_user(user)?),
    };
    let home = passwd.as_ref().map_or_else(
        || "/root".to_owned(),
        |p| p.dir.to_string_lossy().into_owned(),
    );
    let name = passwd
        .as_ref()
        .map_or_else(|| "root".to_owned(), |p| p.name.clone());
    let shell = passwd
        .as_ref()
        .map(|p| p.shell.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty() && Path::new(s).exists())
        .unwrap_or_else(|| "/bin/sh".to_owned());

    let (argv, arg0) = match &spec.command {
        Some(command) => (command.to_argv(), None),
        None if terminal => {
            let base = Path::new(&shell)
                .file_name()
                .map_or_else(|| "sh".to_owned(), |n| n.to_string_lossy().into_owned());
            (vec![shell.clone()], Some(format!("-{base}")))
        }
        None => {
            return Err(ProcessError::Invalid {
                what: "command",
                reason: "a command is required".into(),
            })
        }
    };
    validate_argv(&argv)?;

    let mut env = vec![
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), home.clone()),
        ("USER".to_owned(), name.clone()),
        ("LOGNAME".to_owned(), name),
        ("SHELL".to_owned(), shell),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        (
            "TERM".to_owned(),
            if terminal { "xterm-256color" } else { "dumb" }.to_owned(),
        ),
    ];
    // Egress's proxy variables (when on), then the template's and the request's.
    env.extend(crate::egress::proxy_env());
    for (key, value) in defaults.env.iter().chain(&spec.env) {
        if !super::defaults::valid_env(key, value) {
            return Err(ProcessError::Invalid {
                what: "env",
                reason: format!(
                    "{key:?} is not a valid variable name or its value holds a NUL byte"
                ),
            });
        }
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }

    let cwd = match &spec.cwd {
        Some(cwd) => {
            match std::fs::metadata(cwd) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(ProcessError::Invalid {
                        what: "cwd",
                        reason: format!("{cwd} is not a directory"),
                    })
                }
                Err(error) => {
                    return Err(ProcessError::NoDirectory {
                        path: cwd.clone(),
                        error,
                    })
                }
            }
            cwd.clone()
        }
        None => match defaults.cwd.as_deref() {
            Some(dir) if Path::new(dir).is_dir() => dir.to_owned(),
            default => {
                if let Some(dir) = default {
                    tracing::warn!(dir, "the template's working directory is gone; using home");
                }
                if Path::new(&home).is_dir() {
                    home
                } else {
                    "/".to_owned()
                }
            }
        },
    };

    let identity = match (user, passwd) {
        (None, _) => None,
        (Some(_), Some(passwd)) => Some(identity_of(&passwd, gid)),
        (Some(User::Uid(uid)), None) => {
            let gid = gid.map_or(*uid, Gid::as_raw);
            Some(ChildUser {
                uid: *uid,
                gid,
                groups: vec![gid],
            })
        }
        (Some(User::Name(name)), None) => {
            return Err(ProcessError::UnknownUser { user: name.clone() })
        }
    };
    Ok(LaunchPlan {
        argv,
        arg0,
        env,
        cwd,
        identity,
    })
}

/// Finds the file to execute: a name with a `/` as given, else the first executable
/// match in the child's own `PATH` (std would search the agent's `PATH` instead).
fn resolve_program(plan: &LaunchPlan) -> std::io::Result<PathBuf> {
    let program = &plan.argv[0];
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = plan
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str());
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| is_executable_file(candidate))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{program} not found in PATH"),
            )
        })
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn validate_argv(argv: &[String]) -> Result<(), ProcessError> {
    let invalid = |reason: &str| ProcessError::Invalid {
        what: "command",
        reason: reason.into(),
    };
    match argv.first() {
        None => Err(invalid("the argument vector is empty")),
        Some(program) if program.is_empty() => Err(invalid("the program name is empty")),
        Some(_) if argv.iter().any(|a| a.contains('\0')) => {
            Err(invalid("an argument holds a NUL byte"))
        }
        Some(_) => Ok(()),
    }
}

fn lookup_user(user: &User) -> Result<PasswdUser, ProcessError> {
    let found = match user {
        User::Name(name) => PasswdUser::from_name(name).ok().flatten(),
        User::Uid(uid) => PasswdUser::from_uid(Uid::from_raw(*uid)).ok().flatten(),
    };
    match (found, user) {
        (Some(passwd), _) => Ok(passwd),
        // A bare uid without a passwd entry is allowed; `plan` handles it.
        (None, User::Uid(uid)) => Ok(PasswdUser {
            name: uid.to_string(),
            passwd: CString::default(),
            uid: Uid::from_raw(*uid),
            gid: Gid::from_raw(*uid),
            gecos: CString::default(),
            dir: "/".into(),
            shell: "/bin/sh".into(),
        }),
        (None, User::Name(name)) => Err(ProcessError::UnknownUser { user: name.clone() }),
    }
}

/// Who `passwd` runs as: its primary group (or `gid` instead) and the groups that
/// list it.
fn identity_of(passwd: &PasswdUser, gid: Option<Gid>) -> ChildUser {
    let gid = gid.unwrap_or(passwd.gid);
    let groups = CString::new(passwd.name.as_str())
        .ok()
        .and_then(|name| nix::unistd::getgrouplist(&name, gid).ok())
        .map(|groups| groups.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_else(|| vec![gid.as_raw()]);
    ChildUser {
        uid: passwd.uid.as_raw(),
        gid: gid.as_raw(),
        groups,
    }
}

/// How the child's standard streams are wired.
#[derive(Debug)]
pub enum ChildStdio {
    /// Pipes for stdout and stderr; a pipe for stdin when `stdin` is set, else `/dev/null`.
    Pipes {
        /// Whether the caller will write to stdin.
        stdin: bool,
    },
    /// Pipes for stdout and stderr; stdin is `stdin`, the child's end of a channel
    /// the caller keeps the other end of (an interpreter session's control socket).
    Channel {
        /// The child's end.
        stdin: OwnedFd,
    },
    /// All three on a terminal; the agent keeps `master`.
    Terminal {
        /// The agent's end, already non-blocking.
        master: Arc<AsyncFd<OwnedFd>>,
        /// The child's end.
        slave: OwnedFd,
    },
}

/// The agent's ends of a child's pipes.
#[derive(Debug, Default)]
pub struct ChildPipes {
    /// The child's stdin, when requested.
    pub stdin: Option<pipe::Sender>,
    /// The child's stdout.
    pub stdout: Option<pipe::Receiver>,
    /// The child's stderr.
    pub stderr: Option<pipe::Receiver>,
}

/// The child's ends of its standard streams, and the agent's.
struct Wiring {
    /// What becomes the child's stdin, stdout and stderr.
    child: [OwnedFd; 3],
    pipes: [Option<OwnedFd>; 3],
    pty: Option<Arc<AsyncFd<OwnedFd>>>,
    /// Output streams the record waits to drain.
    open_streams: u8,
}

/// Opens the pipes (or lends the terminal) a child's streams go through. Every
/// descriptor is close-on-exec; the child's ends are put in place in the child.
fn wire(stdio: ChildStdio) -> std::io::Result<Wiring> {
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from);
    match stdio {
        ChildStdio::Pipes { stdin } => {
            let (child_in, agent_in) = if stdin {
                let (read, write) = pipe()?;
                (read, Some(write))
            } else {
                (OwnedFd::from(File::open("/dev/null")?), None)
            };
            let (agent_out, child_out) = pipe()?;
            let (agent_err, child_err) = pipe()?;
            Ok(Wiring {
                child: [child_in, child_out, child_err],
                pipes: [agent_in, Some(agent_out), Some(agent_err)],
                pty: None,
                open_streams: 2,
            })
        }
        ChildStdio::Channel { stdin } => {
            let (agent_out, child_out) = pipe()?;
            let (agent_err, child_err) = pipe()?;
            Ok(Wiring {
                child: [stdin, child_out, child_err],
                pipes: [None, Some(agent_out), Some(agent_err)],
                pty: None,
                open_streams: 2,
            })
        }
        ChildStdio::Terminal { master, slave } => Ok(Wiring {
            child: [slave.try_clone()?, slave.try_clone()?, slave],
            pipes: [None, None, None],
            pty: Some(master),
            open_streams: 1,
        }),
    }
}

/// Starts `plan` and tracks it in `table`.
pub fn start(
    table: &ProcessTable,
    plan: LaunchPlan,
    kind: ProcessKind,
    stdio: ChildStdio,
    capture: Option<Capture>,
) -> Result<(Arc<ProcessRecord>, ChildPipes), ProcessError> {
    let program = plan.argv[0].clone();
    let start_error = |error| ProcessError::Start {
        program: program.clone(),
        error,
    };
    let executable = resolve_program(&plan).map_err(start_error)?;
    let Wiring {
        child,
        pipes: [stdin, stdout, stderr],
        pty,
        open_streams,
    } = wire(stdio).map_err(start_error)?;
    let setup = Setup {
        session: if pty.is_some() {
            ChildSession::Terminal
        } else {
            ChildSession::OwnGroup
        },
        default_interrupt: kind == ProcessKind::Session,
    };
    let cgroup_error = |error| ProcessError::Cgroup {
        program: program.clone(),
        error,
    };
    let mut cgroup = table.confinement().create(kind).map_err(cgroup_error)?;

    let record = {
        let mut permit = table.spawn_gate();
        let started = match (table.confinement(), &mut cgroup) {
            (Confinement::Cgroups(tree), Some(cgroup)) => clone_or_fork(
                tree,
                cgroup,
                kind,
                &plan,
                &executable,
                child,
                setup,
                &mut permit,
            ),
            _ => {
                // Restored when dropped, also when the start fails.
                let _unshield = permit.unshield_oom();
                fork(&plan, &executable, child, setup, None)
            }
        };
        let pid = match started {
            Ok(pid) => pid,
            Err(error) => {
                if let Some(new) = &cgroup {
                    table.confinement().discard(&new.cgroup);
                }
                return Err(start_error(error));
            }
        };
        // The cgroup's directory closes here: the child is in.
        let record = Arc::new(
            ProcessRecord::new(Pid(pid), kind, plan.argv, open_streams, capture, pty)
                .with_cgroup(cgroup.map(|new| new.cgroup))
                .with_ring_pool(table.ring_pool()),
        );
        table.insert(record.clone());
        record
    };
    // From here on the child is tracked; failures below only lose its output.
    // Each is the agent's end of a pipe `wire` just made, as the unchecked
    // constructors require once non-blocking.
    let nonblocking = |fd: OwnedFd| {
        crate::sys::set_fresh_pipe_nonblocking(fd.as_fd())
            .ok()
            .map(|()| fd)
    };
    let pipes = ChildPipes {
        stdin: stdin
            .and_then(nonblocking)
            .and_then(|fd| pipe::Sender::from_owned_fd_unchecked(fd).ok()),
        stdout: stdout
            .and_then(nonblocking)
            .and_then(|fd| pipe::Receiver::from_owned_fd_unchecked(fd).ok()),
        stderr: stderr
            .and_then(nonblocking)
            .and_then(|fd| pipe::Receiver::from_owned_fd_unchecked(fd).ok()),
    };
    Ok((record, pipes))
}

/// What the child sets up before `exec`, besides its streams and user.
#[derive(Debug, Clone, Copy)]
struct Setup {
    session: ChildSession,
    /// `SIGINT` and `SIGQUIT` back to their default action (interpreter sessions).
    default_interrupt: bool,
}

/// Starts the child straight into `cgroup` with `clone3` (see [`crate::sys::spawn`]);
/// where the kernel cannot, forks it and has it join the cgroup before `exec`. A
/// recycled cgroup the child cannot be cloned into (the workload removed it, or
/// gave it sub-cgroups with controllers: `ENODEV`, `EBUSY`) is removed and
/// replaced by a fresh one of `kind`.
#[allow(clippy::too_many_arguments)]
fn clone_or_fork(
    tree: &CgroupTree,
    cgroup: &mut NewCgroup,
    kind: ProcessKind,
    plan: &LaunchPlan,
    executable: &Path,
    stdio: [OwnedFd; 3],
    setup: Setup,
    permit: &mut SpawnPermit<'_>,
) -> std::io::Result<i32> {
    let argv: Vec<&str> = std::iter::once(plan.arg0.as_deref().unwrap_or(&plan.argv[0]))
        .chain(plan.argv.iter().skip(1).map(String::as_str))
        .collect();
    let image = ChildImage::new(
        executable,
        &argv,
        &plan.env,
        &plan.cwd,
        stdio,
        setup.session,
        plan.identity.clone(),
    )?
    .with_oom_score_reset(permit.oom_shielded())
    .with_default_interrupt(setup.default_interrupt);
    let mut cloned = tree.clone_into(&image, cgroup);
    if cgroup.recycled && matches!(cloned, Err(CloneError::Clone(_))) {
        tracing::info!(
            cgroup = cgroup.cgroup.relative(),
            "a recycled cgroup cannot take a child: using a fresh one"
        );
        let fresh = tree.create_fresh(kind)?;
        tree.discard(&std::mem::replace(cgroup, fresh).cgroup);
        cloned = tree.clone_into(&image, cgroup);
    }
    match cloned {
        Ok(pid) => Ok(pid),
        Err(CloneError::Clone(error) | CloneError::Exec(error)) => Err(error),
        Err(CloneError::Unsupported) => {
            // Open until the start returned: the child writes to it before `exec`.
            let procs = cgroup.cgroup.open_procs()?;
            let _unshield = permit.unshield_oom();
            fork(plan, executable, image.into_stdio(), setup, Some(&procs))
        }
    }
}

/// Starts the child with std's `Command`: `posix_spawn` when nothing has to happen
/// in the child before `exec` (no cgroup to join, no terminal, no user switch, no
/// session's signals),
/// else `fork`, the steps, and `exec`.
fn fork(
    plan: &LaunchPlan,
    executable: &Path,
    [stdin, stdout, stderr]: [OwnedFd; 3],
    setup: Setup,
    join_cgroup: Option<&File>,
) -> std::io::Result<i32> {
    let mut command = StdCommand::new(executable);
    command
        .arg0(plan.arg0.as_deref().unwrap_or(&plan.argv[0]))
        .args(plan.argv.iter().skip(1))
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    if setup.session == ChildSession::OwnGroup {
        command.process_group(0);
    }
    sys::set_pre_exec(
        &mut command,
        PreExec {
            join_cgroup: join_cgroup.map(AsRawFd::as_raw_fd),
            take_terminal: setup.session == ChildSession::Terminal,
            user: plan.identity.clone(),
            default_interrupt: setup.default_interrupt,
        },
    );
    // Dropping `Child` neither waits nor kills: the reaper owns its exit. It holds
    // no pipes: the streams were given as descriptors.
    let child = command.spawn()?;
    Ok(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::defaults::DefaultUser;
    use sandbox_protocol::Command;

    fn env_of(plan: &LaunchPlan, key: &str) -> Option<String> {
        plan.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn default_environment_is_clean_and_overridable() {
        let mut spec = ProcessSpec::new(Command::Argv(vec!["true".into()]));
        spec.env = vec![("FOO".into(), "1".into()), ("PATH".into(), "/x".into())];
        let plan = plan(&spec, false, &ProcessDefaults::default()).unwrap();
        assert_eq!(env_of(&plan, "PATH").as_deref(), Some("/x"));
        assert_eq!(env_of(&plan, "FOO").as_deref(), Some("1"));
        assert_eq!(env_of(&plan, "TERM").as_deref(), Some("dumb"));
        assert_eq!(plan.env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        assert!(env_of(&plan, "HOME").is_some());
    }

    #[test]
    fn bad_specs_are_rejected_before_fork() {
        let bad = [
            ProcessSpec::new(Command::Argv(vec![])),
            ProcessSpec::new(Command::Argv(vec!["a\0b".into()])),
            ProcessSpec {
                cwd: Some("/definitely/not/here".into()),
                ..ProcessSpec::new(Command::Shell("true".into()))
            },
            ProcessSpec {
                env: vec![("A=B".into(), "x".into())],
                ..ProcessSpec::new(Command::Shell("true".into()))
            },
            ProcessSpec {
                user: Some(User::Name("no-such-user-xyz".into())),
                ..ProcessSpec::new(Command::Shell("true".into()))
            },
        ];
        for spec in bad {
            assert!(
                plan(&spec, false, &ProcessDefaults::default()).is_err(),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn a_terminal_without_command_runs_a_login_shell() {
        let spec = ProcessSpec {
            command: None,
            env: vec![],
            cwd: None,
            user: None,
        };
        let plan = plan(&spec, true, &ProcessDefaults::default()).unwrap();
        assert!(plan.arg0.as_deref().is_some_and(|a| a.starts_with('-')));
        assert_eq!(env_of(&plan, "TERM").as_deref(), Some("xterm-256color"));
    }

    fn image_defaults() -> ProcessDefaults {
        ProcessDefaults {
            env: vec![
                ("PATH".into(), "/opt/image/bin:/usr/bin:/bin".into()),
                ("IMAGE_ONLY".into(), "image".into()),
                ("BOTH".into(), "image".into()),
            ],
            cwd: Some("/tmp".into()),
            user: DefaultUser::parse("root:4242"),
        }
    }

    #[test]
    fn image_defaults_come_between_the_agents_and_the_requests() {
        let mut spec = ProcessSpec::new(Command::Argv(vec!["true".into()]));
        spec.env = vec![("BOTH".into(), "request".into())];
        let plan = plan(&spec, false, &image_defaults()).unwrap();
        // The image's PATH replaces the agent's; the request's BOTH the image's.
        assert_eq!(
            env_of(&plan, "PATH").as_deref(),
            Some("/opt/image/bin:/usr/bin:/bin")
        );
        assert_eq!(plan.env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        assert_eq!(env_of(&plan, "IMAGE_ONLY").as_deref(), Some("image"));
        assert_eq!(env_of(&plan, "BOTH").as_deref(), Some("request"));
        assert_eq!(env_of(&plan, "LANG").as_deref(), Some("C.UTF-8"));
        assert_eq!(plan.cwd, "/tmp");
        // `root:4242`: root's passwd entry (every system has one), group 4242.
        let identity = plan.identity.as_ref().unwrap();
        assert_eq!((identity.uid, identity.gid), (0, 4242));
        assert!(identity.groups.contains(&4242));
        assert_eq!(env_of(&plan, "USER").as_deref(), Some("root"));
    }

    #[test]
    fn a_request_overrides_the_image_cwd_and_user() {
        let spec = ProcessSpec {
            cwd: Some("/".into()),
            user: Some(User::Uid(4343)),
            ..ProcessSpec::new(Command::Argv(vec!["true".into()]))
        };
        let plan = plan(&spec, false, &image_defaults()).unwrap();
        assert_eq!(plan.cwd, "/");
        // The request's user comes with its own group, not the image's.
        let identity = plan.identity.as_ref().unwrap();
        assert_eq!((identity.uid, identity.gid), (4343, 4343));
    }

    #[test]
    fn a_missing_image_cwd_falls_back_and_a_missing_group_fails() {
        let gone = ProcessDefaults {
            cwd: Some("/definitely/not/here".into()),
            ..ProcessDefaults::default()
        };
        let spec = ProcessSpec::new(Command::Argv(vec!["true".into()]));
        let plan = plan(&spec, false, &gone).unwrap();
        assert_ne!(plan.cwd, "/definitely/not/here");
        assert!(Path::new(&plan.cwd).is_dir());

        let no_group = ProcessDefaults {
            user: DefaultUser::parse("root:no-such-group-xyz"),
            ..ProcessDefaults::default()
        };
        let error = super::plan(&spec, false, &no_group).unwrap_err();
        assert!(
            matches!(error, ProcessError::UnknownGroup { .. }),
            "{error}"
        );
    }
}
