//! Recorded values (`ctx.now`, `ctx.random`, `ctx.uuid`, a validator's verdict), patch markers
//! (`ctx.patched`) and artifacts: answered when issued, from the journal on replay, so they
//! never stay open. What differs between them is their identity.

use crate::journal::{CommandIdentity, CommandKind, Digest, Payload};

/// Whether commands of `kind` are answered when issued rather than settled later.
pub fn answered_when_issued(kind: CommandKind) -> bool {
    matches!(
        kind,
        CommandKind::Now
            | CommandKind::Random
            | CommandKind::Uuid
            | CommandKind::Patch
            | CommandKind::Verdict
            | CommandKind::Artifact
    )
}

/// Identity of a recorded value (`now`, `random`, `uuid`) or a patch marker.
pub fn value_identity(kind: CommandKind, name: &str) -> CommandIdentity {
    CommandIdentity::new(kind, name, &Payload::unit())
}

/// Identity of an artifact commit: its hash is the digest.
pub fn artifact_identity(kind: &str, hash: Digest) -> CommandIdentity {
    CommandIdentity {
        kind: CommandKind::Artifact,
        name: kind.to_owned(),
        input_digest: hash,
    }
}
