//! Requests about how the agent confines processes (see
//! [`sandbox_protocol::Confinement`]): `confinement`, `ps_detail`, and asking why an
//! exec died by `SIGKILL`. Each answers `None` from an agent that predates it
//! (`Unsupported`), so front ends degrade to what `ps` and the exec reply say.

use sandbox_protocol::{
    Confinement, ErrorKind, ExecReply, OomKill, Pid, ProcessDetail, Reply, Request,
};

use super::{unexpected, Client, ClientError};

/// The signal the OOM killer sends.
const SIGKILL: i32 = 9;

impl Client {
    /// How the agent confines processes.
    pub async fn confinement(&self) -> Result<Option<Confinement>, ClientError> {
        match unsupported_as_none(self.request(Request::Confinement).await)? {
            None => Ok(None),
            Some(Reply::Confinement(confinement)) => Ok(Some(confinement)),
            Some(other) => Err(unexpected("confinement", other)),
        }
    }

    /// Every tracked process with its cgroup's state.
    pub async fn ps_detail(&self) -> Result<Option<Vec<ProcessDetail>>, ClientError> {
        match unsupported_as_none(self.request(Request::PsDetail).await)? {
            None => Ok(None),
            Some(Reply::PsDetail(list)) => Ok(Some(list)),
            Some(other) => Err(unexpected("ps_detail", other)),
        }
    }

    /// The OOM kills in the cgroup of `pid`, if the OOM killer struck there.
    pub async fn oom_kill(&self, pid: Pid) -> Result<Option<OomKill>, ClientError> {
        let list = self.ps_detail().await?.unwrap_or_default();
        Ok(list
            .into_iter()
            .find(|row| row.info.pid == pid)
            .and_then(|row| row.oom))
    }

    /// Why an exec that ended by `SIGKILL` (and not at its deadline) was killed, when
    /// it was the OOM killer; no round trip for any other ending. Errors count as
    /// "unknown": this only adds to a result the caller already has.
    pub async fn exec_oom_kill(&self, reply: &ExecReply) -> Option<OomKill> {
        let killed = reply.exit.is_some_and(|exit| exit.signal == Some(SIGKILL));
        if !killed || reply.timed_out {
            return None;
        }
        self.oom_kill(reply.pid).await.ok().flatten()
    }
}

fn unsupported_as_none(reply: Result<Reply, ClientError>) -> Result<Option<Reply>, ClientError> {
    match reply {
        Ok(reply) => Ok(Some(reply)),
        Err(error) if error.wire_kind() == Some(ErrorKind::Unsupported) => Ok(None),
        Err(error) => Err(error),
    }
}
