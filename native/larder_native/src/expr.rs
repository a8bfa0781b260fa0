//! Query expressions: decoding `{:and, [..]}`, `{:or, [..]}`, `{:not, e}`,
//! `{:term, t}` and bare terms, and evaluating them over the bitmaps with the
//! smallest bitmap intersected first.

use crate::atoms;
use crate::error::NativeError;
use roaring::RoaringBitmap;
use rustler::types::tuple::get_tuple;
use rustler::{ListIterator, Term};
use std::borrow::Cow;
use std::collections::HashMap;

/// A decoded expression; leaves hold the term's external format.
pub enum Expr {
    Leaf(Vec<u8>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Not(Box<Expr>),
}

/// The key under which a term's bitmap is stored: its external term format,
/// so two terms share a bitmap exactly when they are `===`.
pub fn term_key(term: Term) -> Vec<u8> {
    term.to_binary().as_slice().to_vec()
}

impl Expr {
    pub fn decode(term: Term) -> Result<Expr, NativeError> {
        if let Ok(elems) = get_tuple(term) {
            if elems.len() == 2 && elems[0].is_atom() {
                let op = elems[0];
                if op == atoms::and().to_term(term.get_env()) {
                    return Ok(Expr::And(Self::decode_list(elems[1])?));
                }
                if op == atoms::or().to_term(term.get_env()) {
                    return Ok(Expr::Or(Self::decode_list(elems[1])?));
                }
                if op == atoms::not().to_term(term.get_env()) {
                    return Ok(Expr::Not(Box::new(Self::decode(elems[1])?)));
                }
                if op == atoms::term().to_term(term.get_env()) {
                    return Ok(Expr::Leaf(term_key(elems[1])));
                }
            }
        }
        Ok(Expr::Leaf(term_key(term)))
    }

    fn decode_list(term: Term) -> Result<Vec<Expr>, NativeError> {
        let iter: ListIterator = term.decode().map_err(|_| NativeError::BadExpr)?;
        iter.map(Self::decode).collect()
    }
}

pub type Bitmaps = HashMap<Vec<u8>, RoaringBitmap>;

/// The ids of every term: the complement's universe for a `not` outside an `and`.
fn universe(bitmaps: &Bitmaps) -> RoaringBitmap {
    let mut all = RoaringBitmap::new();
    for bitmap in bitmaps.values() {
        all |= bitmap;
    }
    all
}

pub fn eval<'b>(bitmaps: &'b Bitmaps, expr: &Expr) -> Cow<'b, RoaringBitmap> {
    match expr {
        Expr::Leaf(key) => match bitmaps.get(key) {
            Some(bitmap) => Cow::Borrowed(bitmap),
            None => Cow::Owned(RoaringBitmap::new()),
        },
        Expr::Or(children) => {
            let mut acc = RoaringBitmap::new();
            for child in children {
                acc |= eval(bitmaps, child).as_ref();
            }
            Cow::Owned(acc)
        }
        Expr::Not(inner) => {
            let mut all = universe(bitmaps);
            all -= eval(bitmaps, inner).as_ref();
            Cow::Owned(all)
        }
        Expr::And(children) => Cow::Owned(eval_and(bitmaps, children)),
    }
}

/// Intersects the positive children smallest first, stopping as soon as the
/// running result is empty, then subtracts the negated ones.
fn eval_and(bitmaps: &Bitmaps, children: &[Expr]) -> RoaringBitmap {
    let mut positives: Vec<Cow<RoaringBitmap>> = Vec::with_capacity(children.len());
    let mut negatives: Vec<&Expr> = Vec::new();
    for child in children {
        match child {
            Expr::Not(inner) => negatives.push(inner),
            Expr::Leaf(key) => match bitmaps.get(key) {
                Some(bitmap) => positives.push(Cow::Borrowed(bitmap)),
                None => return RoaringBitmap::new(),
            },
            other => positives.push(eval(bitmaps, other)),
        }
    }
    let mut acc = if positives.is_empty() {
        universe(bitmaps)
    } else {
        positives.sort_by_key(|bitmap| bitmap.len());
        let mut iter = positives.into_iter();
        let mut acc = iter.next().map(Cow::into_owned).unwrap_or_default();
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

/// Number of 64Ki-id chunks a bitmap spans: an upper bound on its containers.
fn chunks(bitmap: &RoaringBitmap) -> u64 {
    match (bitmap.min(), bitmap.max()) {
        (Some(lo), Some(hi)) => u64::from((hi >> 16) - (lo >> 16)) + 1,
        _ => 0,
    }
}

/// An upper bound on the work an expression costs: `(containers touched, ids returned)`.
pub fn estimate(bitmaps: &Bitmaps, expr: &Expr) -> (u64, u64) {
    match expr {
        Expr::Leaf(key) => bitmaps
            .get(key)
            .map(|bitmap| (chunks(bitmap), bitmap.len()))
            .unwrap_or((0, 0)),
        Expr::Or(children) => children.iter().fold((0, 0), |(w, n), child| {
            let (cw, cn) = estimate(bitmaps, child);
            (w + cw, n + cn)
        }),
        Expr::Not(inner) => {
            let (w, _) = estimate(bitmaps, inner);
            let (uw, un) = bitmaps.values().fold((0, 0), |(w, n), bitmap| {
                (w + chunks(bitmap), n + bitmap.len())
            });
            (w + uw, un)
        }
        Expr::And(children) => {
            let mut work = 0;
            let mut bound = u64::MAX;
            for child in children {
                match child {
                    // Inside an `and`, a `not` is a difference: no universe is built.
                    Expr::Not(inner) => work += estimate(bitmaps, inner).0,
                    _ => {
                        let (cw, cn) = estimate(bitmaps, child);
                        work += cw;
                        bound = bound.min(cn);
                    }
                }
            }
            if bound == u64::MAX {
                bound = bitmaps.values().map(RoaringBitmap::len).sum();
            }
            (work, bound)
        }
    }
}
