//! Requests about the whole machine that are safe on an agent other scenarios share:
//! what `reidentify` refuses. (A token or hostname that is accepted would change the
//! agent for every other scenario: `tests/agent_process.rs` and
//! `tests/pid1_namespace.rs` test those on agents of their own.)

use sandbox_protocol::limits::MAX_TOKEN_BYTES;
use sandbox_protocol::{ErrorKind, ReidentifyRequest};

use crate::transport::Target;
use crate::within;

pub async fn reidentify_refuses_bad_input_and_changes_nothing(target: Target) {
    let client = target.client();
    let request = |hostname: Option<&str>, token: Option<String>| ReidentifyRequest {
        hostname: hostname.map(str::to_owned),
        token,
    };
    let mut refused = vec![
        (request(None, Some(String::new())), ErrorKind::BadRequest),
        (
            request(None, Some("t".repeat(MAX_TOKEN_BYTES + 1))),
            ErrorKind::TooLarge,
        ),
        // A bad name is checked first, so the good token with it is not applied.
        (
            request(Some("bad_name!"), Some("fresh".into())),
            ErrorKind::BadRequest,
        ),
        (request(Some(&"a".repeat(65)), None), ErrorKind::BadRequest),
    ];
    if !target.facts().is_pid1 {
        // Only init changes the machine's hostname (as init it would succeed).
        refused.push((
            request(Some("fork-1"), Some("fresh".into())),
            ErrorKind::PermissionDenied,
        ));
    }
    for (request, kind) in refused {
        let shown = format!("{request:?}");
        let err = within(10, client.reidentify(request)).await.unwrap_err();
        assert_eq!(err.wire_kind(), Some(kind), "{shown}: {err}");
    }
    // Asking for nothing changes nothing.
    within(10, client.reidentify(request(None, None)))
        .await
        .unwrap();
    // The agent still admits new connections with the transport's token.
    target.assert_serves().await;
}
