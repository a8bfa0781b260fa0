//! Query expressions: decoding `{:and, [..]}`, `{:or, [..]}`, `{:not, e}`,
//! `{:term, t}` and bare terms, and evaluating them over the bitmaps with the
//! smallest bitmap intersected first.

use crate::atoms;
use crate::error::NativeError;
use crate::key::{elem, encode, tuple_elems};
use roaring::RoaringBitmap;
use rustler::{ListIterator, Term};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A small multiply-rotate hasher (as in rustc's FxHash): keys are short
/// encoded terms and the table is private, so SipHash's DoS resistance buys
/// nothing and costs a good part of a lookup.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// One term's ids, with their smallest and largest kept up to date by the
/// writer: a query's cost estimate and its intersections read them instead of
/// scanning the first and last containers (`min()` and `max()` do).
#[derive(Default)]
pub struct Posting {
    pub ids: RoaringBitmap,
    pub min: u32,
    pub max: u32,
}

impl Posting {
    /// Recomputes the bounds after a write.
    pub fn refresh(&mut self) {
        self.min = self.ids.min().unwrap_or(0);
        self.max = self.ids.max().unwrap_or(0);
    }

    /// Number of 64Ki-id chunks the ids span: an upper bound on their containers.
    fn chunks(&self) -> u64 {
        if self.ids.is_empty() {
            0
        } else {
            u64::from((self.max >> 16) - (self.min >> 16)) + 1
        }
    }
}

pub type Bitmaps = HashMap<Vec<u8>, Posting, BuildHasherDefault<KeyHasher>>;

/// An expression whose leaves are resolved to their postings (looked up once).
pub enum Plan<'b> {
    Leaf(Option<&'b Posting>),
    And(Vec<Plan<'b>>),
    Or(Vec<Plan<'b>>),
    Not(Box<Plan<'b>>),
}

/// Decodes `term` and looks its leaves up at once. `key` is a scratch buffer
/// for the leaves' keys, so a query allocates no key.
pub fn plan<'b>(
    bitmaps: &'b Bitmaps,
    term: Term,
    key: &mut Vec<u8>,
) -> Result<Plan<'b>, NativeError> {
    if let Some(&[op, arg]) = tuple_elems(term) {
        let (op, arg) = (elem(term, op), elem(term, arg));
        if op.is_atom() {
            let env = term.get_env();
            if op == atoms::and().to_term(env) {
                return Ok(Plan::And(plan_list(bitmaps, arg, key)?));
            }
            if op == atoms::or().to_term(env) {
                return Ok(Plan::Or(plan_list(bitmaps, arg, key)?));
            }
            if op == atoms::not().to_term(env) {
                return Ok(Plan::Not(Box::new(plan(bitmaps, arg, key)?)));
            }
            if op == atoms::term().to_term(env) {
                return Ok(leaf(bitmaps, arg, key));
            }
        }
    }
    Ok(leaf(bitmaps, term, key))
}

fn plan_list<'b>(
    bitmaps: &'b Bitmaps,
    term: Term,
    key: &mut Vec<u8>,
) -> Result<Vec<Plan<'b>>, NativeError> {
    let iter: ListIterator = term.decode().map_err(|_| NativeError::BadExpr)?;
    iter.map(|child| plan(bitmaps, child, key)).collect()
}

fn leaf<'b>(bitmaps: &'b Bitmaps, term: Term, key: &mut Vec<u8>) -> Plan<'b> {
    key.clear();
    encode(term, key);
    Plan::Leaf(bitmaps.get(key.as_slice()))
}

/// The ids of every term: the complement's universe for a `not` outside an `and`.
fn universe(bitmaps: &Bitmaps) -> RoaringBitmap {
    let mut all = RoaringBitmap::new();
    for posting in bitmaps.values() {
        all |= &posting.ids;
    }
    all
}

pub fn eval<'b>(bitmaps: &'b Bitmaps, plan: &Plan<'b>) -> Cow<'b, RoaringBitmap> {
    match plan {
        Plan::Leaf(Some(posting)) => Cow::Borrowed(&posting.ids),
        Plan::Leaf(None) => Cow::Owned(RoaringBitmap::new()),
        Plan::Or(children) => {
            let mut acc = RoaringBitmap::new();
            for child in children {
                acc |= eval(bitmaps, child).as_ref();
            }
            Cow::Owned(acc)
        }
        Plan::Not(inner) => {
            let mut all = universe(bitmaps);
            all -= eval(bitmaps, inner).as_ref();
            Cow::Owned(all)
        }
        Plan::And(children) => Cow::Owned(eval_and(bitmaps, children)),
    }
}

/// Intersects the positive children smallest first, stopping as soon as the
/// running result is empty, then subtracts the negated ones.
fn eval_and<'b>(bitmaps: &'b Bitmaps, children: &[Plan<'b>]) -> RoaringBitmap {
    let mut positives: Vec<Cow<RoaringBitmap>> = Vec::with_capacity(children.len());
    let mut negatives: Vec<&Plan> = Vec::new();
    for child in children {
        match child {
            Plan::Not(inner) => negatives.push(inner),
            Plan::Leaf(Some(posting)) => positives.push(Cow::Borrowed(&posting.ids)),
            Plan::Leaf(None) => return RoaringBitmap::new(),
            other => positives.push(eval(bitmaps, other)),
        }
    }
    let mut acc = if positives.is_empty() {
        universe(bitmaps)
    } else {
        positives.sort_by_key(|bitmap| bitmap.len());
        let mut iter = positives.into_iter();
        let first = iter.next().expect("positives is not empty");
        // The two smallest make a fresh (small) bitmap instead of a clone of
        // the smallest one; later intersections then work on that.
        let mut acc = match iter.next() {
            Some(second) => first.as_ref() & second.as_ref(),
            None => first.into_owned(),
        };
        for bitmap in iter {
            if acc.is_empty() {
                return acc;
            }
            acc &= bitmap.as_ref();
        }
        acc
    };
    for negative in negatives {
        if acc.is_empty() {
            break;
        }
        acc -= eval(bitmaps, negative).as_ref();
    }
    acc
}

/// An upper bound on the work a plan costs: `(containers touched, ids returned)`.
pub fn estimate(bitmaps: &Bitmaps, plan: &Plan) -> (u64, u64) {
    match plan {
        Plan::Leaf(Some(posting)) => (posting.chunks(), posting.ids.len()),
        Plan::Leaf(None) => (0, 0),
        Plan::Or(children) => children.iter().fold((0, 0), |(w, n), child| {
            let (cw, cn) = estimate(bitmaps, child);
            (w + cw, n + cn)
        }),
        Plan::Not(inner) => {
            let (w, _) = estimate(bitmaps, inner);
            let (uw, un) = bitmaps.values().fold((0, 0), |(w, n), posting| {
                (w + posting.chunks(), n + posting.ids.len())
            });
            (w + uw, un)
        }
        Plan::And(children) => {
            let mut work = 0;
            let mut bound = u64::MAX;
            for child in children {
                match child {
                    // Inside an `and`, a `not` is a difference: no universe is built.
                    Plan::Not(inner) => work += estimate(bitmaps, inner).0,
                    _ => {
                        let (cw, cn) = estimate(bitmaps, child);
                        work += cw;
                        bound = bound.min(cn);
                    }
                }
            }
            if bound == u64::MAX {
                bound = bitmaps.values().map(|posting| posting.ids.len()).sum();
            }
            (work, bound)
        }
    }
}
