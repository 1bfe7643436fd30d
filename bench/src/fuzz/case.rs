//! One case: a class of input, an entry point, an `Authorization`, and the request itself, all
//! drawn from a random stream of its own (seed, worker, number), so any case can be made again.

use std::str::FromStr;

use rand::distr::{Alphanumeric, SampleString as _};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng, SeedableRng as _};

use super::generate::{Generator, Known, Operation};
use super::schema::Schema;
use super::ws::{Init, Protocol, Session};
use super::{hostile, mutate};

/// Kinds of input; `--skip` takes their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Class {
    /// Operations generated from schema.graphql.
    Schema,
    /// Lists, objects and selections nested up to thousands deep.
    Nesting,
    /// Fragment chains that spread the next one 2-3 times, up to 30 levels; spread cycles.
    Fragments,
    /// Thousands of aliases, fields or duplicate directives.
    Aliases,
    /// Huge string, number and block-string literals.
    Literals,
    /// Long operation names, named in `operationName` or not.
    Names,
    /// 4-byte, combining and right-to-left text; NUL and lone-surrogate escapes; comments.
    Unicode,
    /// Bodies that are not UTF-8, not JSON, truncated, batched or over the size limit (HTTP).
    Bytes,
    /// Byte-level mutations of the README's examples and the tests' operations.
    Mutate,
    /// Variables of random types, deeply nested, huge arrays.
    Variables,
    /// Websocket protocol abuse: garbage frames, bad connection_init, duplicate ids.
    Protocol,
}

impl Class {
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .expect("no class is skipped by clap")
            .get_name()
            .to_owned()
    }

    /// How often each class is drawn, relative to the others.
    fn weight(self) -> u32 {
        match self {
            Self::Schema => 30,
            Self::Mutate => 20,
            Self::Unicode | Self::Variables => 8,
            Self::Nesting | Self::Bytes | Self::Protocol => 6,
            Self::Fragments | Self::Aliases | Self::Literals => 5,
            Self::Names => 3,
        }
    }
}

/// `<worker>:<number>`, as printed with a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaseId {
    pub worker: u32,
    pub number: u64,
}

impl FromStr for CaseId {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (worker, number) = text
            .split_once(':')
            .ok_or_else(|| format!("expected <worker>:<number>, got `{text}`"))?;
        Ok(Self {
            worker: worker.parse().map_err(|err| format!("worker: {err}"))?,
            number: number.parse().map_err(|err| format!("number: {err}"))?,
        })
    }
}

impl std::fmt::Display for CaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.worker, self.number)
    }
}

#[derive(Clone, Debug)]
pub enum Auth {
    None,
    Valid,
    Garbage(Vec<u8>),
}

#[derive(Clone, Debug)]
pub enum Entry {
    Http(Vec<u8>),
    Ws(Session),
}

impl Entry {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Http(_) => "POST /graphql",
            Self::Ws(session) => match session.protocol {
                Protocol::TransportWs => "ws graphql-transport-ws",
                Protocol::Legacy => "ws graphql-ws",
            },
        }
    }
}

#[derive(Clone, Debug)]
pub struct Case {
    pub id: CaseId,
    pub class: Class,
    pub auth: Auth,
    pub entry: Entry,
}

impl Case {
    pub fn describe(&self) -> String {
        let auth = match &self.auth {
            Auth::None => "none".to_owned(),
            Auth::Valid => "valid token".to_owned(),
            Auth::Garbage(bytes) => format!("{:?}", String::from_utf8_lossy(bytes)),
        };
        let request = match &self.entry {
            Entry::Http(body) => String::from_utf8_lossy(body).into_owned(),
            Entry::Ws(session) => session.describe(),
        };
        format!(
            "case {} ({}, {}, Authorization: {auth})\n{request}",
            self.id,
            self.class.name(),
            self.entry.name()
        )
    }
}

/// What the generators share for the whole run.
pub struct Inputs {
    pub schema: Schema,
    pub known: Known,
    pub corpus: Vec<String>,
    pub classes: Vec<Class>,
}

/// SplitMix64's finaliser: spreads seed, worker and number over the whole state.
fn mix(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

pub fn generate_case(seed: u64, id: CaseId, inputs: &Inputs) -> Case {
    let mut rng = StdRng::seed_from_u64(mix(seed ^ mix((u64::from(id.worker) << 48) ^ id.number)));
    let class = *inputs
        .classes
        .choose_weighted(&mut rng, |class| class.weight())
        .expect("at least one class");
    let auth = match rng.random_range(0..20) {
        0..=11 => Auth::None,
        12..=16 => Auth::Valid,
        _ => Auth::Garbage(garbage_authorization(&mut rng)),
    };
    let protocol = if rng.random_bool(2.0 / 3.0) {
        Protocol::TransportWs
    } else {
        Protocol::Legacy
    };
    let entry = match class {
        Class::Bytes => {
            let operation = Generator::new(&inputs.schema, &inputs.known, &mut rng).operation();
            Entry::Http(hostile::malformed_body(&mut rng, &operation))
        }
        Class::Protocol => Entry::Ws(Session::abuse(&mut rng, protocol)),
        _ if rng.random_bool(0.75) => {
            let operation = operation(class, &mut rng, inputs, 10_000);
            Entry::Http(operation.to_json().into_bytes())
        }
        _ => {
            let init = match auth {
                Auth::Valid => Init::Token,
                _ => Init::Anonymous,
            };
            // serde_json refuses nesting past 128 in a websocket message as a whole; deeper
            // variables are the HTTP side's and the protocol class's.
            let operations: Vec<Operation> = (0..rng.random_range(1..=3))
                .map(|_| operation(class, &mut rng, inputs, 100))
                .collect();
            Entry::Ws(Session::documents(protocol, init, &operations))
        }
    };
    Case {
        id,
        class,
        auth,
        entry,
    }
}

fn operation(class: Class, rng: &mut StdRng, inputs: &Inputs, max_json_depth: usize) -> Operation {
    match class {
        Class::Nesting => hostile::nesting(rng),
        Class::Fragments => hostile::fragments(rng),
        Class::Aliases => hostile::aliases(rng),
        Class::Literals => hostile::literals(rng),
        Class::Names => hostile::names(rng),
        Class::Unicode => hostile::unicode(rng),
        Class::Variables => hostile::variables(rng, max_json_depth),
        Class::Mutate => {
            let document = inputs.corpus.choose(rng).expect("a corpus");
            let mutated = mutate::mutate(rng, document.as_bytes(), &inputs.corpus);
            Operation::new(String::from_utf8_lossy(&mutated).into_owned())
        }
        Class::Schema | Class::Bytes | Class::Protocol => {
            Generator::new(&inputs.schema, &inputs.known, rng).operation()
        }
    }
}

fn garbage_authorization(rng: &mut impl Rng) -> Vec<u8> {
    let value = match rng.random_range(0..6) {
        0 => "Bearer".to_owned(),
        1 => "Bearer a.b.c".to_owned(),
        2 => "Basic eDp5".to_owned(),
        3 => format!("Bearer {}", "x".repeat(rng.random_range(1..16_000))),
        4 => format!("bearer  {}", Alphanumeric.sample_string(rng, 40)),
        _ => {
            return (0..rng.random_range(1..200))
                .map(|_| rng.random_range(0x20..=0xff))
                .collect();
        }
    };
    value.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(classes: Vec<Class>) -> Inputs {
        Inputs {
            schema: Schema::load(),
            known: Known {
                ids: vec!["QXJ0aWNsZTox".to_owned()],
            },
            corpus: mutate::corpus(),
            classes,
        }
    }

    #[test]
    fn the_same_seed_and_id_make_the_same_case() {
        let inputs = inputs(<Class as clap::ValueEnum>::value_variants().to_vec());
        for number in 0..200 {
            let id = CaseId { worker: 3, number };
            let first = generate_case(42, id, &inputs).describe();
            assert_eq!(first, generate_case(42, id, &inputs).describe());
            assert_ne!(first, generate_case(43, id, &inputs).describe());
        }
    }

    #[test]
    fn skipped_classes_are_never_drawn() {
        let inputs = inputs(vec![Class::Schema, Class::Unicode]);
        for number in 0..200 {
            let case = generate_case(7, CaseId { worker: 0, number }, &inputs);
            assert!(matches!(case.class, Class::Schema | Class::Unicode));
        }
    }

    #[test]
    fn case_ids_read_as_they_are_printed() {
        let id: CaseId = "3:17".parse().unwrap();
        assert_eq!(
            id,
            CaseId {
                worker: 3,
                number: 17
            }
        );
        assert_eq!(id.to_string(), "3:17");
        assert!("3".parse::<CaseId>().is_err());
    }
}
