//! The NIF's error type. Every error reaches Elixir as a value:
//! `{:error, {code, message}}`, or `{:error, {code, partition, message}}`
//! for an error of one partition (`:offset_out_of_range`). `code` is an
//! atom: librdkafka's error name in snake case (`:all_brokers_down`,
//! `:unknown_topic_or_part`, from a fixed table, so the atom table stays
//! bounded) or one of ours (`:config`, `:closed`, `:bad_arg`, `:panic`).

use crate::atoms;
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rustler::{Atom, Encoder, Env, Term};

#[derive(Debug)]
pub struct NifError {
    code: Code,
    partition: Option<i32>,
    message: String,
}

#[derive(Debug)]
enum Code {
    Ours(fn() -> Atom),
    Kafka(RDKafkaErrorCode),
}

impl NifError {
    pub fn ours(code: fn() -> Atom, message: impl Into<String>) -> NifError {
        NifError {
            code: Code::Ours(code),
            partition: None,
            message: message.into(),
        }
    }

    pub fn bad_arg(message: impl Into<String>) -> NifError {
        NifError::ours(atoms::bad_arg, message)
    }

    pub fn closed() -> NifError {
        NifError::ours(atoms::closed, "the client was closed")
    }

    pub fn code(code: RDKafkaErrorCode, message: impl Into<String>) -> NifError {
        NifError {
            code: Code::Kafka(code),
            partition: None,
            message: message.into(),
        }
    }

    /// An error that librdkafka reported as a raw response code.
    pub fn resp(err: RDKafkaRespErr, partition: Option<i32>, message: String) -> NifError {
        NifError {
            code: Code::Kafka(err.into()),
            partition,
            message,
        }
    }

    /// The code's atom, `:offset_out_of_range` for `OffsetOutOfRange`.
    fn atom<'a>(&self, env: Env<'a>) -> Term<'a> {
        match &self.code {
            Code::Ours(f) => f().encode(env),
            Code::Kafka(code) => {
                let name = snake_case(&format!("{code:?}"));
                match Atom::from_str(env, &name) {
                    Ok(atom) => atom.encode(env),
                    Err(_) => atoms::kafka().encode(env),
                }
            }
        }
    }

    pub fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        let message = self.message.as_str().encode(env);
        let reason = match self.partition {
            Some(p) => (self.atom(env), p, message).encode(env),
            None => (self.atom(env), message).encode(env),
        };
        (atoms::error(), reason).encode(env)
    }
}

impl From<KafkaError> for NifError {
    fn from(err: KafkaError) -> NifError {
        let message = err.to_string();
        match err {
            KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => {
                NifError::ours(atoms::config, message)
            }
            other => match other.rdkafka_error_code() {
                Some(code) => NifError::code(code, message),
                None => NifError::ours(atoms::kafka, message),
            },
        }
    }
}

/// `OffsetOutOfRange` -> `offset_out_of_range`, `PartitionEOF` ->
/// `partition_eof`: an underscore before an upper-case letter that follows
/// a lower-case one, or that starts a word after an acronym.
fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::snake_case;

    #[test]
    fn names() {
        assert_eq!(snake_case("OffsetOutOfRange"), "offset_out_of_range");
        assert_eq!(snake_case("PartitionEOF"), "partition_eof");
        assert_eq!(snake_case("AllBrokersDown"), "all_brokers_down");
        assert_eq!(snake_case("SSLError"), "ssl_error");
    }
}
