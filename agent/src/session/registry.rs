//! Sessions by name: the live ones (at most [`MAX_SESSIONS`]) and the memory of the
//! dead (see the module docs of [`super`] for why they are remembered).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sandbox_protocol::eval::MAX_SESSIONS;
use sandbox_protocol::{Language, ProcessSpec};

use super::interpreter::{describe_exit, Session};
use super::SessionError;
use crate::process::table::ProcessTable;

/// A session whose interpreter ended.
#[derive(Debug)]
struct Dead {
    name: String,
    /// How its interpreter ended, for the error that reports it.
    how: String,
}

#[derive(Debug, Default)]
struct Registry {
    live: HashMap<String, Arc<Session>>,
    /// Oldest first.
    dead: VecDeque<Dead>,
}

impl Registry {
    /// Moves `name`'s live session to the dead when its interpreter has ended.
    fn bury_if_ended(&mut self, name: &str) {
        let ended = self
            .live
            .get(name)
            .and_then(|session| session.exit().map(|status| (session.clone(), status)));
        if let Some((session, status)) = ended {
            self.live.remove(name);
            self.remember(&session.name, describe_exit(Some(status)));
        }
    }

    fn remember(&mut self, name: &str, how: String) {
        self.dead.retain(|dead| dead.name != name);
        if self.dead.len() >= MAX_SESSIONS {
            self.dead.pop_front();
        }
        self.dead.push_back(Dead {
            name: name.to_owned(),
            how,
        });
    }
}

/// Every session of the agent.
#[derive(Debug, Default)]
pub struct Sessions {
    registry: Mutex<Registry>,
}

impl Sessions {
    /// No sessions yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every update leaves the maps consistent before anything that could panic.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live session `name`, started now if there is none: with `restart` also
    /// in place of a dead one. Returns it and whether this call started it. `name`
    /// must be valid.
    pub fn open(
        &self,
        table: &ProcessTable,
        name: &str,
        language: Language,
        restart: bool,
    ) -> Result<(Arc<Session>, bool), SessionError> {
        let mut registry = self.lock();
        registry.bury_if_ended(name);
        if let Some(session) = registry.live.get(name) {
            if session.language != language {
                return Err(SessionError::WrongLanguage {
                    name: name.to_owned(),
                    existing: session.language,
                    asked: language,
                });
            }
            return Ok((session.clone(), false));
        }
        if let Some(at) = registry.dead.iter().position(|dead| dead.name == name) {
            if !restart {
                return Err(SessionError::Died {
                    name: name.to_owned(),
                    how: registry.dead[at].how.clone(),
                });
            }
            registry.dead.remove(at);
        }
        if registry.live.len() >= MAX_SESSIONS {
            // Room may be held by sessions that ended since they were last used.
            let names: Vec<String> = registry.live.keys().cloned().collect();
            for other in names {
                registry.bury_if_ended(&other);
            }
            if registry.live.len() >= MAX_SESSIONS {
                return Err(SessionError::TooMany);
            }
        }
        // Started under the lock (a fork and exec, about a millisecond), so two
        // first evaluations of one name start one interpreter.
        // The template's defaults (environment, directory, user) come from the
        // table, as for every process.
        let session = Session::start(
            table,
            name,
            language,
            ProcessSpec {
                command: None,
                env: Vec::new(),
                cwd: None,
                user: None,
            },
        )?;
        registry.live.insert(name.to_owned(), session.clone());
        Ok((session, true))
    }

    /// Forgets `session` as live once it died (its evaluation saw it end, or it was
    /// killed for breaking its protocol): it is remembered as dead. Nothing happens
    /// if the name already belongs to another session (it was closed meanwhile).
    pub fn bury(&self, session: &Arc<Session>) {
        let mut registry = self.lock();
        let current = registry
            .live
            .get(&session.name)
            .is_some_and(|live| Arc::ptr_eq(live, session));
        if current {
            registry.live.remove(&session.name);
            let how = describe_exit(session.exit());
            registry.remember(&session.name, how);
        }
    }

    /// Ends session `name`: returns the live session for the caller to kill, or
    /// `None` when only a dead one was known (it is forgotten). `Unknown` when neither.
    pub fn close(&self, name: &str) -> Result<Option<Arc<Session>>, SessionError> {
        let mut registry = self.lock();
        if let Some(session) = registry.live.remove(name) {
            return Ok(Some(session));
        }
        match registry.dead.iter().position(|dead| dead.name == name) {
            Some(at) => {
                registry.dead.remove(at);
                Ok(None)
            }
            None => Err(SessionError::Unknown {
                name: name.to_owned(),
            }),
        }
    }

    /// Every live session.
    pub fn live(&self) -> Vec<Arc<Session>> {
        self.lock().live.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_are_remembered_newest_last_and_within_the_cap() {
        let mut registry = Registry::default();
        for n in 0..MAX_SESSIONS + 3 {
            registry.remember(&format!("s{n}"), "exited with code 0".into());
        }
        assert_eq!(registry.dead.len(), MAX_SESSIONS);
        assert_eq!(registry.dead.front().map(|d| d.name.as_str()), Some("s3"));
        // Dying again moves a name to the back, once.
        registry.remember("s3", "was killed by signal 9".into());
        assert_eq!(registry.dead.len(), MAX_SESSIONS);
        let last = registry.dead.back().unwrap();
        assert_eq!(
            (last.name.as_str(), last.how.as_str()),
            ("s3", "was killed by signal 9")
        );
    }

    #[test]
    fn closing_an_unknown_name_is_an_error_and_a_dead_one_forgets_it() {
        let sessions = Sessions::new();
        assert!(matches!(
            sessions.close("nope"),
            Err(SessionError::Unknown { .. })
        ));
        sessions
            .lock()
            .remember("gone", "exited with code 1".into());
        assert!(matches!(sessions.close("gone"), Ok(None)));
        assert!(sessions.close("gone").is_err());
    }
}
