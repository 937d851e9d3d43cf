//! Encryption at rest: the codec every stored value passes through, and the built-in one,
//! AES-256-GCM under a ring of named keys.
//!
//! As with Temporal's payload codec, the store never sees the codec's keys or format: it hands
//! each value with its context (the name of its table and the row's key) to [`Codec::encode`]
//! before writing and to [`Codec::decode`] after reading. The context is bound into the seal,
//! so a value moved to another row or table does not open.
//!
//! [`Keyring`] seals each value under its first key and names that key in the value, so keys
//! can rotate: put a new key first, keep the old ones after it while values sealed under them
//! remain, and rewrite those (`waymark rekey`) before dropping a key.

use std::fmt;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::Digest as _;

/// The first byte of a sealed value in the store or in an export: the codec's bytes follow.
/// Records start with their format byte, which is far below.
pub(crate) const SEALED: u8 = 0xC5;

/// Turns a stored value into what is written, and back. Implement it to encrypt with keys held
/// elsewhere (a KMS, say); [`Keyring`] is the built-in one.
///
/// Both directions run on the worker's async threads at times (a lone commit is sealed on the
/// thread that submits it; an operation read from memory is opened where it is read), so they
/// must not block: fetch and cache data keys ahead of use, never call the KMS per value.
pub trait Codec: Send + Sync + 'static {
    /// Seals `plain`, a value stored under `context`.
    fn encode(&self, context: &[u8], plain: &[u8]) -> Result<Vec<u8>, CodecError>;

    /// Opens what [`Codec::encode`] sealed under the same `context`.
    fn decode(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CodecError>;

    /// Whether `sealed` is sealed the way [`Codec::encode`] seals now (under the current key):
    /// rekeying rewrites the values for which it is not.
    fn is_current(&self, _sealed: &[u8]) -> bool {
        true
    }
}

/// A value the codec could not seal or open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Sealed under a key the codec was not given.
    #[error("sealed under key `{0}`, which is not among the keys given")]
    UnknownKey(String),
    /// Sealed, and no codec was given to open it.
    #[error(
        "it is encrypted and no keys were given (WAYMARK_ENCRYPTION_KEYS or \
         WAYMARK_ENCRYPTION_KEYS_FILE)"
    )]
    NoKeys,
    /// The seal does not verify: the value was altered, or sealed for another place.
    #[error("its seal does not verify: altered, or sealed for another place")]
    Forged,
    /// Not laid out as the codec seals.
    #[error("not a sealed value: {0}")]
    Malformed(&'static str),
    /// The codec's own failure (a key service that does not answer, say).
    #[error("{0}")]
    Failed(String),
}

/// A spec of encryption keys that cannot be used. Never names a key's secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    /// A key id that is empty, too long or has characters other than `A-Z a-z 0-9 - _ .`.
    #[error("key id `{0}` must be 1 to 64 of A-Z a-z 0-9 - _ .")]
    BadId(String),
    /// The secret is not 64 hexadecimal digits (32 bytes).
    #[error("key `{0}`: the secret must be 64 hexadecimal digits (32 bytes)")]
    BadSecret(String),
    /// An entry of a spec that is not `id:secret` with a valid id and a secret of 64 hex
    /// digits. The entry is not shown: with its fields swapped, its id is its secret.
    #[error(
        "entry {0} of the key spec is not `id:secret`, with an id of 1 to 64 of A-Z a-z 0-9 - _ . \
         and a secret of 64 hexadecimal digits (the entry is not shown)"
    )]
    BadEntry(usize),
    /// Two keys with one id.
    #[error("key id `{0}` is given twice")]
    DuplicateId(String),
    /// Two ids with one secret: a rotation that rotated nothing.
    #[error("keys `{0}` and `{1}` have the same secret")]
    DuplicateSecret(String, String),
    /// No key at all.
    #[error("the key spec holds no key")]
    Empty,
    /// The keys file could not be read.
    #[error("reading the keys file {path}: {message}")]
    File {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}

/// One AES-256 key and the id that names it in every value sealed under it.
pub struct EncryptionKey {
    id: String,
    key: LessSafeKey,
    fingerprint: [u8; 32],
}

impl EncryptionKey {
    /// A key named `id` with the 32 bytes `secret`.
    pub fn new(id: &str, secret: [u8; 32]) -> Result<Self, KeySpecError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if id.is_empty() || id.len() > 64 || !id.chars().all(valid) {
            return Err(KeySpecError::BadId(id.chars().take(64).collect()));
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &secret)
            .map_err(|_| KeySpecError::BadSecret(id.to_owned()))?;
        Ok(Self {
            id: id.to_owned(),
            key: LessSafeKey::new(unbound),
            fingerprint: sha2::Sha256::digest(secret).into(),
        })
    }

    /// A new key named `id` from the system's random source.
    pub fn generate(id: &str) -> Result<Self, KeySpecError> {
        let mut secret = [0u8; 32];
        SystemRandom::new()
            .fill(&mut secret)
            .map_err(|_| KeySpecError::BadSecret(id.to_owned()))?;
        Self::new(id, secret)
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The built-in codec: AES-256-GCM, each value under a fresh random nonce, sealed under the
/// first key and opened under whichever key it names.
///
/// A sealed value is `[1][id length][id][nonce: 12][ciphertext and tag]`; the context and the
/// bytes before the nonce are authenticated with it. Nonces are random, so a key should seal
/// fewer than 2³² values: rotate well before (a busy worker writes a few values per step).
pub struct Keyring {
    keys: Vec<EncryptionKey>,
    random: SystemRandom,
}

/// The layout version of a value sealed by [`Keyring`].
const SEALED_V1: u8 = 1;

/// The environment variable holding a key spec.
pub const KEYS_ENV: &str = "WAYMARK_ENCRYPTION_KEYS";
/// The environment variable naming a file that holds a key spec.
pub const KEYS_FILE_ENV: &str = "WAYMARK_ENCRYPTION_KEYS_FILE";

impl Keyring {
    /// A ring sealing under `keys[0]` and opening under any of `keys`.
    pub fn new(keys: Vec<EncryptionKey>) -> Result<Self, KeySpecError> {
        if keys.is_empty() {
            return Err(KeySpecError::Empty);
        }
        for (i, key) in keys.iter().enumerate() {
            for earlier in &keys[..i] {
                if earlier.id == key.id {
                    return Err(KeySpecError::DuplicateId(key.id.clone()));
                }
                if earlier.fingerprint == key.fingerprint {
                    return Err(KeySpecError::DuplicateSecret(
                        earlier.id.clone(),
                        key.id.clone(),
                    ));
                }
            }
        }
        Ok(Self {
            keys,
            random: SystemRandom::new(),
        })
    }

    /// Reads a spec: `id:secret` entries (the secret as 64 hex digits), separated by commas or
    /// new lines, the current key first; blank lines and lines starting with `#` are skipped.
    pub fn parse(spec: &str) -> Result<Self, KeySpecError> {
        let entries = spec
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('#'))
            .flat_map(|line| line.split(','))
            .map(str::trim)
            .filter(|entry| !entry.is_empty());
        let keys = entries
            .enumerate()
            .map(|(i, entry)| parse_key(i + 1, entry))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(keys)
    }

    /// The ring in [`KEYS_ENV`], or in the file [`KEYS_FILE_ENV`] names; `None` if neither is
    /// set.
    pub fn from_env() -> Result<Option<Self>, KeySpecError> {
        if let Ok(spec) = std::env::var(KEYS_ENV) {
            return Self::parse(&spec).map(Some);
        }
        let Ok(path) = std::env::var(KEYS_FILE_ENV) else {
            return Ok(None);
        };
        let spec = std::fs::read_to_string(&path).map_err(|e| KeySpecError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::parse(&spec).map(Some)
    }

    /// The id of the key new values are sealed under.
    pub fn current_key_id(&self) -> &str {
        &self.keys[0].id
    }

    fn key(&self, id: &[u8]) -> Result<&EncryptionKey, CodecError> {
        let found = self.keys.iter().find(|k| k.id.as_bytes() == id);
        found.ok_or_else(|| CodecError::UnknownKey(String::from_utf8_lossy(id).into_owned()))
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("keys", &ids).finish()
    }
}

fn parse_key(entry: usize, text: &str) -> Result<EncryptionKey, KeySpecError> {
    let bad = KeySpecError::BadEntry(entry);
    let (id, secret) = text.split_once(':').ok_or(bad.clone())?;
    let (id, secret) = (id.trim(), secret.trim());
    if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad);
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        let pair = &secret[2 * i..2 * i + 2];
        *byte = u8::from_str_radix(pair, 16).map_err(|_| bad.clone())?;
    }
    EncryptionKey::new(id, bytes).map_err(|_| bad)
}

/// The parts of a value [`Keyring`] sealed.
struct Sealed<'a> {
    /// The bytes authenticated but not encrypted: version, id length, id.
    header: &'a [u8],
    key_id: &'a [u8],
    nonce: [u8; NONCE_LEN],
    body: &'a [u8],
}

fn split_sealed(sealed: &[u8]) -> Result<Sealed<'_>, CodecError> {
    let short = CodecError::Malformed("shorter than its header");
    let (&version, rest) = sealed.split_first().ok_or(short.clone())?;
    if version != SEALED_V1 {
        return Err(CodecError::Malformed("unknown layout version"));
    }
    let (&id_len, rest) = rest.split_first().ok_or(short.clone())?;
    let id_len = usize::from(id_len);
    let key_id = rest.get(..id_len).ok_or(short.clone())?;
    let rest = &rest[id_len..];
    let (nonce, body) = rest.split_first_chunk::<NONCE_LEN>().ok_or(short)?;
    Ok(Sealed {
        header: &sealed[..2 + id_len],
        key_id,
        nonce: *nonce,
        body,
    })
}

fn aad(context: &[u8], header: &[u8]) -> Vec<u8> {
    // The context's length goes first, so that no context and header pair reads as another.
    let mut aad = Vec::with_capacity(8 + context.len() + header.len());
    aad.extend_from_slice(&(context.len() as u64).to_be_bytes());
    aad.extend_from_slice(context);
    aad.extend_from_slice(header);
    aad
}

impl Codec for Keyring {
    fn encode(&self, context: &[u8], plain: &[u8]) -> Result<Vec<u8>, CodecError> {
        let key = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| CodecError::Failed("the system's random source failed".into()))?;
        // The id is at most 64 bytes (checked in `EncryptionKey::new`).
        let mut out = vec![SEALED_V1, key.id.len() as u8];
        out.extend_from_slice(key.id.as_bytes());
        let aad = aad(context, &out);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .map_err(|_| CodecError::Failed("AES-GCM refused to seal".into()))?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    fn decode(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CodecError> {
        let parts = split_sealed(sealed)?;
        let key = self.key(parts.key_id)?;
        let mut body = parts.body.to_vec();
        let aad = Aad::from(aad(context, parts.header));
        let nonce = Nonce::assume_unique_for_key(parts.nonce);
        let plain = key.key.open_in_place(nonce, aad, &mut body);
        let len = plain.map_err(|_| CodecError::Forged)?.len();
        body.truncate(len);
        Ok(body)
    }

    fn is_current(&self, sealed: &[u8]) -> bool {
        split_sealed(sealed).is_ok_and(|parts| parts.key_id == self.keys[0].id.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B: &str = "b:ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_value_opens_under_its_context_and_no_other() {
        let ring = Keyring::parse(A).unwrap();
        let sealed = ring.encode(b"journal", b"secret text").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(ring.decode(b"journal", &sealed).unwrap(), b"secret text");
        assert_eq!(ring.decode(b"inbox", &sealed), Err(CodecError::Forged));
    }

    #[test]
    fn an_altered_byte_anywhere_is_refused() {
        let ring = Keyring::parse(A).unwrap();
        let sealed = ring.encode(b"t", b"value").unwrap();
        for i in 0..sealed.len() {
            let mut altered = sealed.clone();
            altered[i] ^= 1;
            assert!(ring.decode(b"t", &altered).is_err(), "byte {i}");
        }
        for len in 0..sealed.len() {
            assert!(ring.decode(b"t", &sealed[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn after_rotation_old_values_open_and_new_ones_use_the_new_key() {
        let old = Keyring::parse(A).unwrap();
        let sealed_before = old.encode(b"t", b"before").unwrap();
        let rotated = Keyring::parse(&format!("{B}\n{A}")).unwrap();
        assert_eq!(rotated.decode(b"t", &sealed_before).unwrap(), b"before");
        assert!(!rotated.is_current(&sealed_before));
        let sealed_after = rotated.encode(b"t", b"after").unwrap();
        assert!(rotated.is_current(&sealed_after));
        assert_eq!(
            old.decode(b"t", &sealed_after),
            Err(CodecError::UnknownKey("b".into()))
        );
    }

    #[test]
    fn bad_specs_are_refused_without_naming_a_secret() {
        let secret = &A[2..];
        let cases = [
            ("", KeySpecError::Empty),
            ("# only a comment", KeySpecError::Empty),
            (secret, KeySpecError::BadEntry(1)),
            ("a:00", KeySpecError::BadEntry(1)),
            (&format!("{A}\na b:{secret}"), KeySpecError::BadEntry(2)),
            // Fields swapped: the "id" is the secret, and is not shown.
            (&format!("{secret}:a"), KeySpecError::BadEntry(1)),
            (&format!("{A},{A}"), KeySpecError::DuplicateId("a".into())),
            (
                &format!("{A},c:{secret}"),
                KeySpecError::DuplicateSecret("a".into(), "c".into()),
            ),
        ];
        for (spec, expected) in cases {
            let error = Keyring::parse(spec).unwrap_err();
            assert_eq!(error, expected, "{spec}");
            assert!(!error.to_string().contains(secret));
        }
    }

    #[test]
    fn debug_shows_ids_only() {
        let ring = Keyring::parse(&format!("{A},{B}")).unwrap();
        let shown = format!("{ring:?} {:?}", ring.keys[0]);
        assert!(shown.contains("\"a\"") && shown.contains("\"b\""));
        assert!(!shown.contains("0102030405"));
    }
}
