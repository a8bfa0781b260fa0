//! librdkafka configuration from Elixir: a list of `{key, value}` binaries,
//! bounded in number and size, with the settings a client of ours depends
//! on forced over the caller's.

use crate::error::NifError;
use rdkafka::ClientConfig;
use rustler::{Binary, Term};

const MAX_PAIRS: usize = 256;
const MAX_BYTES: usize = 65_536;

/// Decodes `[{key, value}]` (binaries, no NUL byte, each under 64 KiB, at
/// most 256 pairs) into a `ClientConfig`, then sets `defaults` that the
/// caller did not give and `forced` whatever the caller gave.
pub fn decode(
    term: Term,
    defaults: &[(&str, &str)],
    forced: &[(&str, &str)],
) -> Result<ClientConfig, NifError> {
    let pairs: Vec<(Binary, Binary)> = term
        .decode()
        .map_err(|_| NifError::bad_arg("config must be a list of {binary, binary}"))?;
    if pairs.len() > MAX_PAIRS {
        return Err(NifError::bad_arg("config has more than 256 pairs"));
    }
    let mut config = ClientConfig::new();
    for (key, value) in pairs {
        let key = text(key.as_slice())?;
        let value = text(value.as_slice())?;
        config.set(key, value);
    }
    for (key, value) in defaults {
        if config.get(key).is_none() {
            config.set(*key, *value);
        }
    }
    for (key, value) in forced {
        config.set(*key, *value);
    }
    Ok(config)
}

fn text(bytes: &[u8]) -> Result<&str, NifError> {
    if bytes.len() > MAX_BYTES {
        return Err(NifError::bad_arg("a config key or value is over 64 KiB"));
    }
    if bytes.contains(&0) {
        return Err(NifError::bad_arg("a config key or value holds a NUL byte"));
    }
    std::str::from_utf8(bytes).map_err(|_| NifError::bad_arg("a config key or value is not UTF-8"))
}

/// A timeout in ms from Elixir, bounded to 10 minutes.
pub fn timeout(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms.min(600_000))
}

/// A topic name as Kafka allows it: 1..249 bytes of `[a-zA-Z0-9._-]`.
pub fn topic(bytes: &[u8]) -> Result<&str, NifError> {
    let ok = !bytes.is_empty()
        && bytes.len() <= 249
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        // Checked above: every byte is ASCII.
        std::str::from_utf8(bytes).map_err(|_| NifError::bad_arg("topic"))
    } else {
        Err(NifError::bad_arg(
            "a topic is 1..249 bytes of letters, digits, '.', '_' and '-'",
        ))
    }
}
