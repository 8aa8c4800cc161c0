//! The template's defaults for every process the agent starts: exec, spawn, pty
//! (and interpreter sessions), taken from the image's config ([`ImageConfig`]: an
//! OCI image's `Env`, `WorkingDir` and `User`) and applied where the launch plan is
//! built ([`super::launch::plan`]):
//!
//! - environment: the agent's own defaults, then the image's variables, then the
//!   request's; a later entry wins;
//! - working directory: the request's, else the image's, else the user's home
//!   (or `/`);
//! - user: the request's, else the image's (`name`, `uid`, `uid:gid`, `name:group`),
//!   else the agent's own.
//!
//! The config is checked once, at start ([`ProcessDefaults::from_image`]): an entry
//! the agent cannot use (a variable name holding `=`, a relative directory, a user it
//! cannot parse) is logged and dropped, so a bad image never makes every request
//! fail. Names are looked up in the guest's `/etc/passwd` and `/etc/group` at each
//! start, as a request's are (the workload may add users).
//!
//! A working directory that does not exist: the template builder creates the image's
//! (as Docker does at run time), so it is missing only when something removed it
//! since; a process then starts in the user's home (or `/`) and the agent logs a
//! warning, rather than failing every request that names no directory.

use nix::unistd::{Gid, Group as GroupEntry};
use sandbox_protocol::{ImageConfig, User};

use super::ProcessError;

/// The defaults in force for processes whose request leaves a setting out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessDefaults {
    /// Variables set after the agent's own defaults and before the request's, in order.
    pub env: Vec<(String, String)>,
    /// The working directory of a request that names none (absolute).
    pub cwd: Option<String>,
    /// Who a request that names no one runs as.
    pub user: Option<DefaultUser>,
}

/// An image's `User`: a user, and the group to run with instead of its passwd entry's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultUser {
    /// The user, by name or number.
    pub user: User,
    /// The primary group, when the spec names one (`user:group`).
    pub group: Option<Group>,
}

/// A group, as a `User` spec names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// A name, looked up in the guest's `/etc/group`.
    Name(String),
    /// A number, used as is.
    Gid(u32),
}

impl ProcessDefaults {
    /// The usable part of `image`; what is dropped is logged.
    pub fn from_image(image: &ImageConfig) -> Self {
        let env = image
            .env
            .iter()
            .filter(|(key, value)| {
                let usable = valid_env(key, value);
                if !usable {
                    tracing::error!(key, "image variable ignored: not a valid name or value");
                }
                usable
            })
            .cloned()
            .collect();
        let cwd = image
            .cwd
            .as_deref()
            .filter(|dir| !dir.is_empty())
            .filter(|dir| {
                let usable = dir.starts_with('/') && !dir.contains('\0');
                if !usable {
                    tracing::error!(dir, "image working directory ignored: not an absolute path");
                }
                usable
            })
            .map(str::to_owned);
        let user = image
            .user
            .as_deref()
            .filter(|spec| !spec.is_empty())
            .and_then(|spec| {
                let parsed = DefaultUser::parse(spec);
                if parsed.is_none() {
                    tracing::error!(
                        user = spec,
                        "image user ignored: expected NAME, UID, or either with :GROUP or :GID"
                    );
                }
                parsed
            });
        Self { env, cwd, user }
    }
}

/// A variable the environment can hold: a non-empty name without `=`, no NUL bytes.
pub fn valid_env(key: &str, value: &str) -> bool {
    !key.is_empty() && !key.contains('=') && !key.contains('\0') && !value.contains('\0')
}

impl DefaultUser {
    /// Parses an OCI `User`: `name`, `uid`, `name:group`, `uid:gid` (or a mix). A part
    /// of digits only is a number.
    pub fn parse(spec: &str) -> Option<Self> {
        let (user, group) = match spec.split_once(':') {
            Some((user, group)) => (user, Some(group)),
            None => (spec, None),
        };
        let user = match number_or_name(user)? {
            Ok(uid) => User::Uid(uid),
            Err(name) => User::Name(name),
        };
        let group = match group {
            None => None,
            Some(group) => Some(match number_or_name(group)? {
                Ok(gid) => Group::Gid(gid),
                Err(name) => Group::Name(name),
            }),
        };
        Some(Self { user, group })
    }
}

/// `Ok(number)` for a part of digits that fits a `u32`, `Err(name)` for another
/// usable name; `None` for an empty part or one with a separator, space or NUL.
fn number_or_name(part: &str) -> Option<Result<u32, String>> {
    if part.is_empty() || part.contains([':', '/', '\0']) || part.contains(char::is_whitespace) {
        return None;
    }
    if part.bytes().all(|b| b.is_ascii_digit()) {
        return part.parse().ok().map(Ok);
    }
    Some(Err(part.to_owned()))
}

impl Group {
    /// The group's number: a name is looked up in the guest's `/etc/group`.
    pub fn gid(&self) -> Result<Gid, ProcessError> {
        match self {
            Self::Gid(gid) => Ok(Gid::from_raw(*gid)),
            Self::Name(name) => match GroupEntry::from_name(name) {
                Ok(Some(group)) => Ok(group.gid),
                _ => Err(ProcessError::UnknownGroup {
                    group: name.clone(),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(spec: &str) -> Option<DefaultUser> {
        DefaultUser::parse(spec)
    }

    #[test]
    fn user_specs_parse_as_oci_writes_them() {
        assert_eq!(
            user("app"),
            Some(DefaultUser {
                user: User::Name("app".into()),
                group: None
            })
        );
        assert_eq!(
            user("1000:1001"),
            Some(DefaultUser {
                user: User::Uid(1000),
                group: Some(Group::Gid(1001))
            })
        );
        assert_eq!(
            user("app:staff"),
            Some(DefaultUser {
                user: User::Name("app".into()),
                group: Some(Group::Name("staff".into()))
            })
        );
        assert_eq!(
            user("0:wheel"),
            Some(DefaultUser {
                user: User::Uid(0),
                group: Some(Group::Name("wheel".into()))
            })
        );
        // Digits beyond a uid are not a number; a name may hold digits.
        assert_eq!(
            user("u2"),
            Some(DefaultUser {
                user: User::Name("u2".into()),
                group: None
            })
        );
        for bad in [
            "",
            ":",
            "app:",
            ":staff",
            "a:b:c",
            "a b",
            "99999999999",
            "a\0b",
        ] {
            assert_eq!(user(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn unusable_image_entries_are_dropped_and_the_rest_kept() {
        let image = ImageConfig {
            env: vec![
                ("PATH".into(), "/opt/bin:/usr/bin".into()),
                ("A=B".into(), "x".into()),
                (String::new(), "x".into()),
                ("NUL".into(), "a\0b".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            cwd: Some("relative/dir".into()),
            user: Some("a:b:c".into()),
            sessions: vec![],
        };
        let defaults = ProcessDefaults::from_image(&image);
        assert_eq!(
            defaults.env,
            vec![
                ("PATH".to_owned(), "/opt/bin:/usr/bin".to_owned()),
                ("LANG".to_owned(), "C.UTF-8".to_owned())
            ]
        );
        assert_eq!(defaults.cwd, None);
        assert_eq!(defaults.user, None);

        let image = ImageConfig {
            cwd: Some("/app".into()),
            user: Some("nobody".into()),
            ..ImageConfig::default()
        };
        let defaults = ProcessDefaults::from_image(&image);
        assert_eq!(defaults.cwd.as_deref(), Some("/app"));
        assert_eq!(
            defaults.user.map(|u| u.user),
            Some(User::Name("nobody".into()))
        );
        // Empty strings (an OCI config's "no value") mean no default.
        let empty = ImageConfig {
            cwd: Some(String::new()),
            user: Some(String::new()),
            ..ImageConfig::default()
        };
        assert_eq!(
            ProcessDefaults::from_image(&empty),
            ProcessDefaults::default()
        );
    }

    #[test]
    fn groups_resolve_by_number_or_name() {
        assert_eq!(Group::Gid(4242).gid().unwrap(), Gid::from_raw(4242));
        // Every Linux system has group 0 under the name `root`.
        assert_eq!(Group::Name("root".into()).gid().unwrap(), Gid::from_raw(0));
        let missing = Group::Name("no-such-group-xyz".into()).gid().unwrap_err();
        assert!(matches!(missing, ProcessError::UnknownGroup { .. }));
    }
}
