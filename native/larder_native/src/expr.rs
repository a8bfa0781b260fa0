//! Query expressions: decoding `{:and, [..]}`, `{:or, [..]}`, `{:not, e}`,
//! `{:term, t}` and bare terms, and evaluating them over the bitmaps with the
//! smallest bitmap intersected first.

use crate::atoms;
use crate::budget::Budget;
use crate::error::NativeError;
use crate::key::{elem, encode, next_cell, tuple_elems};
use crate::stack::Stack;
use imbl::shared_ptr::ArcK;
use imbl::GenericHashMap;
use roaring::RoaringBitmap;
use rustler::Term;
use std::borrow::Cow;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_le_bytes(word);
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

/// Bytes of postings alive in the whole VM (every index): each posting's
/// serialized size, added when it is built and taken off when it is freed.
/// Tests read it to check that dropped indexes free their memory.
pub static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// One term's ids, with their smallest and largest kept up to date by the
/// writer: a query's cost estimate and its intersections read them instead of
/// scanning the first and last containers (`min()` and `max()` do).
#[derive(Default)]
pub struct Posting {
    pub ids: RoaringBitmap,
    pub min: u32,
    pub max: u32,
    /// This posting's share of `LIVE_BYTES`.
    counted: usize,
}

impl Clone for Posting {
    fn clone(&self) -> Self {
        LIVE_BYTES.fetch_add(self.counted, Ordering::Relaxed);
        Posting {
            ids: self.ids.clone(),
            min: self.min,
            max: self.max,
            counted: self.counted,
        }
    }
}

impl Drop for Posting {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

impl Posting {
    /// Recomputes the bounds and the byte count after a write.
    pub fn refresh(&mut self) {
        self.min = self.ids.min().unwrap_or(0);
        self.max = self.ids.max().unwrap_or(0);
        let size = self.ids.serialized_size();
        LIVE_BYTES.fetch_add(size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
        self.counted = size;
    }

    /// Bytes the ids take (their serialized size, which tracks the containers).
    pub fn bytes(&self) -> usize {
        self.counted
    }

    /// Number of 64Ki-id chunks the ids span: an upper bound on their containers.
    pub fn chunks(&self) -> u64 {
        if self.ids.is_empty() {
            0
        } else {
            u64::from((self.max >> 16) - (self.min >> 16)) + 1
        }
    }
}

/// Term key -> ids: a persistent hash map, so a writer's copy shares every
/// posting it does not touch with the snapshot readers hold (a clone is O(1),
/// an update copies O(log terms) nodes and the postings it changes).
pub type Bitmaps = GenericHashMap<Arc<[u8]>, Arc<Posting>, BuildHasherDefault<KeyHasher>, ArcK>;

/// One immutable state of an index, as readers see it.
#[derive(Clone, Default)]
pub struct State {
    pub bitmaps: Bitmaps,
    /// Sums over every posting of `chunks()` and of the ids: the cost of the
    /// universe a `not` outside an `and` builds, without a scan.
    pub chunks: u64,
    pub ids: u64,
}

/// Nesting of `:and`, `:or` and `:not` a query may have: evaluation recurses
/// over the decoded plan (never over the term), bounded by this.
pub const MAX_DEPTH: usize = 100;

/// An expression whose leaves are resolved to their postings (looked up once).
pub enum Plan<'b> {
    Leaf(Option<&'b Posting>),
    And(Vec<Plan<'b>>),
    Or(Vec<Plan<'b>>),
    Not(Box<Plan<'b>>),
}

enum Node<'a> {
    List { and: bool, list: Term<'a> },
    Not(Term<'a>),
    Leaf(Term<'a>),
}

fn node(term: Term) -> Node {
    if let Some(&[op, arg]) = tuple_elems(term) {
        let (op, arg) = (elem(term, op), elem(term, arg));
        if op.is_atom() {
            let env = term.get_env();
            if op == atoms::and().to_term(env) {
                return Node::List {
                    and: true,
                    list: arg,
                };
            }
            if op == atoms::or().to_term(env) {
                return Node::List {
                    and: false,
                    list: arg,
                };
            }
            if op == atoms::not().to_term(env) {
                return Node::Not(arg);
            }
            if op == atoms::term().to_term(env) {
                return Node::Leaf(arg);
            }
        }
    }
    Node::Leaf(term)
}

/// An operator whose operands are being decoded.
enum Frame<'a, 'b> {
    List {
        and: bool,
        rest: Term<'a>,
        done: Vec<Plan<'b>>,
    },
    Not,
}

/// Decodes `term` and looks its leaves up at once, with an explicit stack of
/// operators (deeper than `MAX_DEPTH` is `TooDeep`). `key` is a scratch
/// buffer for the leaves' keys, so a query allocates no key.
pub fn plan<'b>(
    bitmaps: &'b Bitmaps,
    term: Term,
    key: &mut Vec<u8>,
    budget: &mut Budget,
) -> Result<Plan<'b>, NativeError> {
    let mut stack: Stack<Frame, 4> = Stack::new();
    let mut next = term;
    loop {
        // Descend to the first operand that is not an operator.
        let mut done = loop {
            budget.spend(1)?;
            if stack.len() >= MAX_DEPTH {
                return Err(NativeError::TooDeep);
            }
            match node(next) {
                Node::Leaf(term) => break leaf(bitmaps, term, key, budget)?,
                Node::Not(arg) => {
                    stack.push(Frame::Not);
                    next = arg;
                }
                Node::List { and, list } => {
                    let mut rest = list;
                    match next_cell(&mut rest) {
                        Some(Ok(head)) => {
                            stack.push(Frame::List {
                                and,
                                rest,
                                done: Vec::new(),
                            });
                            next = head;
                        }
                        None if and => break Plan::And(Vec::new()),
                        None => break Plan::Or(Vec::new()),
                        Some(Err(())) => return Err(NativeError::BadExpr),
                    }
                }
            }
        };
        // Hand `done` to its operator, closing each operator it completes.
        loop {
            match stack.last_mut() {
                None => return Ok(done),
                Some(Frame::Not) => {
                    stack.pop();
                    done = Plan::Not(Box::new(done));
                }
                Some(Frame::List {
                    and,
                    rest,
                    done: children,
                }) => {
                    children.push(done);
                    match next_cell(rest) {
                        Some(Ok(head)) => {
                            next = head;
                            break;
                        }
                        Some(Err(())) => return Err(NativeError::BadExpr),
                        None => {
                            let and = *and;
                            let children = std::mem::take(children);
                            stack.pop();
                            done = if and {
                                Plan::And(children)
                            } else {
                                Plan::Or(children)
                            };
                        }
                    }
                }
            }
        }
    }
}

fn leaf<'b>(
    bitmaps: &'b Bitmaps,
    term: Term,
    key: &mut Vec<u8>,
    budget: &mut Budget,
) -> Result<Plan<'b>, NativeError> {
    key.clear();
    encode(term, key, budget)?;
    Ok(Plan::Leaf(bitmaps.get(key.as_slice()).map(Arc::as_ref)))
}

/// The ids of every term: the complement's universe for a `not` outside an `and`.
fn universe(bitmaps: &Bitmaps) -> RoaringBitmap {
    let mut all = RoaringBitmap::new();
    for posting in bitmaps.values() {
        all |= &posting.ids;
    }
    all
}

/// The ids `plan` matches. Recursion follows the plan, whose depth `plan`
/// bounds by `MAX_DEPTH`.
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
    positives.sort_by_key(|bitmap| bitmap.len());
    let mut iter = positives.into_iter();
    let mut acc = match (iter.next(), iter.next()) {
        (None, _) => universe(bitmaps),
        (Some(first), None) => first.into_owned(),
        // The two smallest make a fresh (small) bitmap instead of a clone of
        // the smallest one; later intersections then work on that.
        (Some(first), Some(second)) => first.as_ref() & second.as_ref(),
    };
    for bitmap in iter {
        if acc.is_empty() {
            return acc;
        }
        acc &= bitmap.as_ref();
    }
    for negative in negatives {
        if acc.is_empty() {
            break;
        }
        acc -= eval(bitmaps, negative).as_ref();
    }
    acc
}

/// An upper bound on the work a plan costs: `(containers touched, ids
/// returned)`. Recursion follows the plan, bounded by `MAX_DEPTH`.
pub fn estimate(state: &State, plan: &Plan) -> (u64, u64) {
    match plan {
        Plan::Leaf(Some(posting)) => (posting.chunks(), posting.ids.len()),
        Plan::Leaf(None) => (0, 0),
        Plan::Or(children) => children.iter().fold((0, 0), |(w, n), child| {
            let (cw, cn) = estimate(state, child);
            (w.saturating_add(cw), n.saturating_add(cn))
        }),
        Plan::Not(inner) => {
            let (w, _) = estimate(state, inner);
            (w.saturating_add(state.chunks), state.ids)
        }
        Plan::And(children) => {
            let mut work: u64 = 0;
            let mut bound = u64::MAX;
            for child in children {
                match child {
                    // Inside an `and`, a `not` is a difference: no universe is built.
                    Plan::Not(inner) => work = work.saturating_add(estimate(state, inner).0),
                    _ => {
                        let (cw, cn) = estimate(state, child);
                        work = work.saturating_add(cw);
                        bound = bound.min(cn);
                    }
                }
            }
            if bound == u64::MAX {
                work = work.saturating_add(state.chunks);
                bound = state.ids;
            }
            (work, bound)
        }
    }
}
