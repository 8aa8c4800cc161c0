//! One request in, one final answer out: routes each [`Request`] to its handler.

use sandbox_protocol::{Reply, Request, WireError};

use crate::agent::Agent;
use crate::events::Events;
use crate::process::{exec, kill, logs, pty};

/// Runs `request` to its final reply, sending progress through `events`.
pub async fn handle(agent: &Agent, request: Request, events: &Events) -> Result<Reply, WireError> {
    let table = &agent.table;
    let result = match request {
        Request::Exec(request) => exec::exec(table, request, events).await.map(Reply::Exec),
        Request::Spawn(request) => exec::spawn(table, &request.spec).map(Reply::Spawned),
        Request::Logs(request) => logs::logs(table, request, events).await.map(Reply::Logs),
        Request::Ps => Ok(Reply::Ps(table.list())),
        Request::Kill(request) => kill::kill(table, request).map(|()| Reply::Done),
        Request::PtyOpen(request) => pty::open(table, &request).map(Reply::PtyOpened),
        Request::PtyInput(request) => pty::input(table, request.pid, &request.data)
            .await
            .map(|()| Reply::Done),
        Request::PtyResize(request) => {
            pty::resize(table, request.pid, request.size).map(|()| Reply::Done)
        }
        Request::Info => Ok(Reply::Info(agent.info())),
    };
    result.map_err(|error| error.to_wire())
}
