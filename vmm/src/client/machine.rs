//! Requests about the whole guest rather than one process or file (see
//! [`sandbox_protocol::machine`]): `info`, `resumed` after a snapshot restore or a
//! fork, `reidentify` after a fork, and `shutdown`.

use sandbox_protocol::{
    AgentInfo, ReidentifyRequest, Reply, Request, ResumedRequest, ShutdownRequest,
};

use super::{unexpected, Client, ClientError};

impl Client {
    /// Describes the agent.
    pub async fn info(&self) -> Result<AgentInfo, ClientError> {
        match self.request(Request::Info).await? {
            Reply::Info(info) => Ok(info),
            other => Err(unexpected("info", other)),
        }
    }

    /// Tells the guest it was restored (or forked): set its clock to `wall_clock_ns`,
    /// mix in `entropy`, and with `new_identity` write a new machine id.
    pub async fn resumed(
        &self,
        wall_clock_ns: u64,
        entropy: Vec<u8>,
        new_identity: bool,
    ) -> Result<AgentInfo, ClientError> {
        let request = ResumedRequest {
            wall_clock_ns,
            entropy,
            new_identity,
        };
        match self.request(Request::Resumed(request)).await? {
            Reply::Info(info) => Ok(info),
            other => Err(unexpected("resumed", other)),
        }
    }

    /// Gives a fork child an identity of its own, after [`Client::resumed`]: with
    /// `hostname` the guest's new hostname (set in the kernel and in `/etc/hostname`;
    /// only an agent that is the guest's init does it, others answer
    /// `PermissionDenied`), with `token` the token every connection opened from now
    /// on must present. Fields left `None` keep their value.
    ///
    /// This connection, and every other one already open, stays served under the
    /// old token: reconnect with the new one (keep it before sending this). An empty
    /// token or an invalid hostname is `BadRequest`, a token over
    /// [`MAX_TOKEN_BYTES`](sandbox_protocol::limits::MAX_TOKEN_BYTES) `TooLarge`;
    /// a refused request changes nothing. An agent older than this request answers
    /// `Unsupported`.
    pub async fn reidentify(&self, request: ReidentifyRequest) -> Result<(), ClientError> {
        self.expect_done("reidentify", Request::Reidentify(request))
            .await
    }

    /// Asks the agent to stop every process and power the guest off (or reboot).
    pub async fn shutdown(&self, reboot: bool) -> Result<(), ClientError> {
        self.expect_done("shutdown", Request::Shutdown(ShutdownRequest { reboot }))
            .await
    }
}
