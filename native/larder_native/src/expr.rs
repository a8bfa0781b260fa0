//! Query expressions: decoding `{:and, [..]}`, `{:or, [..]}`, `{:not, e}`,
//! `{:term, t}` and bare terms, and evaluating them over the bitmaps with the
//! smallest bitmap intersected first.

use crate::atoms;
use crate::budget::Budget;
use crate::error::NativeError;
use crate::key::{elem, encode, next_cell, tuple_elems};
use crate::posting::{Chunk, Posting};
use crate::rev::Reverse;
use crate::stack::Stack;
use roaring::RoaringBitmap;
use rustler::Term;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::sync::Arc;

pub use crate::terms::Terms as Bitmaps;

/// One immutable state of an index, as readers see it.
#[derive(Clone, Default)]
pub struct State {
    pub bitmaps: Bitmaps,
    /// Sums over every posting of its chunks and of its ids: the cost of the
    /// universe a `not` outside an `and` builds, without a scan.
    pub chunks: u64,
    pub ids: u64,
    /// The id-to-terms map, for an index made with `reverse: true`.
    pub reverse: Option<Reverse>,
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
                                done: Vec::with_capacity(8),
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

/// A set of ids as chunks sorted by their high 16 bits (none empty),
/// borrowed from the postings where a chunk passes through unchanged.
pub type Chunks<'b> = Vec<(u16, Cow<'b, RoaringBitmap>)>;

/// Ids in a chunk list.
pub fn chunks_len(chunks: &Chunks) -> u64 {
    chunks.iter().map(|(_, ids)| ids.len()).sum()
}

/// An operand of an `and`: a posting as it is, or an evaluated sub-expression.
enum Set<'b> {
    Posting(&'b Posting),
    Chunks(Chunks<'b>),
}

impl<'b> Set<'b> {
    fn len(&self) -> u64 {
        match self {
            Set::Posting(posting) => posting.len,
            Set::Chunks(chunks) => chunks_len(chunks),
        }
    }

    fn find(&self, key: u16) -> Option<&RoaringBitmap> {
        match self {
            Set::Posting(posting) => posting.find(key),
            Set::Chunks(chunks) => chunks
                .binary_search_by_key(&key, |(k, _)| *k)
                .ok()
                .and_then(|i| chunks.get(i))
                .map(|(_, ids)| ids.as_ref()),
        }
    }
}

fn borrow(posting: &Posting) -> Chunks<'_> {
    posting
        .chunks
        .iter()
        .map(|(key, chunk)| (*key, Cow::Borrowed(&chunk.ids)))
        .collect()
}

fn set<'b>(bitmaps: &'b Bitmaps, plan: &Plan<'b>) -> Set<'b> {
    match plan {
        Plan::Leaf(Some(posting)) => Set::Posting(posting),
        other => Set::Chunks(eval(bitmaps, other)),
    }
}

/// `a | b`, chunk by chunk.
fn union<'b>(a: Chunks<'b>, b: Chunks<'b>) -> Chunks<'b> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some((ka, _)), Some((kb, _))) if ka < kb => a.next(),
            (Some((ka, _)), Some((kb, _))) if ka > kb => b.next(),
            (Some(_), Some(_)) => match (a.next(), b.next()) {
                (Some((key, mut ids)), Some((_, other))) => {
                    *ids.to_mut() |= other.as_ref();
                    Some((key, ids))
                }
                _ => None,
            },
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => None,
        };
        match next {
            Some(chunk) => out.push(chunk),
            None => return out,
        }
    }
}

/// `acc - other`, chunk by chunk.
fn subtract<'b>(acc: &mut Chunks<'b>, other: &Set) {
    for (key, ids) in acc.iter_mut() {
        if let Some(minus) = other.find(*key) {
            *ids.to_mut() -= minus;
        }
    }
    acc.retain(|(_, ids)| !ids.is_empty());
}

/// The ids of every term: the complement's universe for a `not` outside an `and`.
fn universe(bitmaps: &Bitmaps) -> Chunks<'static> {
    let mut all: std::collections::BTreeMap<u16, RoaringBitmap> = Default::default();
    for posting in bitmaps.values() {
        for (key, chunk) in &posting.chunks {
            *all.entry(*key).or_default() |= &chunk.ids;
        }
    }
    all.into_iter()
        .map(|(key, ids)| (key, Cow::Owned(ids)))
        .collect()
}

/// The ids `plan` matches. Recursion follows the plan, whose depth `plan`
/// bounds by `MAX_DEPTH`.
pub fn eval<'b>(bitmaps: &'b Bitmaps, plan: &Plan<'b>) -> Chunks<'b> {
    match plan {
        Plan::Leaf(Some(posting)) => borrow(posting),
        Plan::Leaf(None) => Vec::new(),
        Plan::Or(children) => children
            .iter()
            .fold(Vec::new(), |acc, child| union(acc, eval(bitmaps, child))),
        Plan::Not(inner) => {
            let mut all = universe(bitmaps);
            subtract(&mut all, &set(bitmaps, inner));
            all
        }
        Plan::And(children) => eval_and(bitmaps, children),
    }
}

/// Below this many ids in its smallest operand, an `and` probes each of
/// those ids in the other operands (a lookup each) instead of intersecting
/// whole bitmaps: no bitmap is built, only the answer.
const PROBE_IDS: u64 = 4_096;

impl Set<'_> {
    #[inline]
    fn contains(&self, id: u32) -> bool {
        self.find((id >> 16) as u16)
            .is_some_and(|ids| ids.contains(id))
    }

    fn for_each(&self, mut f: impl FnMut(u32)) {
        match self {
            Set::Posting(posting) => posting
                .chunks
                .iter()
                .for_each(|(_, chunk)| chunk.ids.iter().for_each(&mut f)),
            Set::Chunks(chunks) => chunks
                .iter()
                .for_each(|(_, ids)| ids.iter().for_each(&mut f)),
        }
    }
}

/// The ids `plan` matches, in order, into `out` (cleared first). An `and`
/// of terms leapfrogs; an `and` whose smallest operand is small probes its
/// ids in the others; anything else is `eval` flattened.
pub fn eval_ids<'b>(bitmaps: &'b Bitmaps, plan: &Plan<'b>, out: &mut Vec<u32>) {
    out.clear();
    if let Plan::And(children) = plan {
        let mut postings: Postings = SmallVec::new();
        let mut terms = true;
        for child in children {
            match child {
                Plan::Leaf(posting) => postings.push(*posting),
                _ => {
                    terms = false;
                    break;
                }
            }
        }
        if terms && !postings.is_empty() {
            and_of_terms(&postings, out);
            return;
        }
        if let Some(ids) = probe_and(bitmaps, children) {
            *out = ids;
            return;
        }
    }
    let chunks = eval(bitmaps, plan);
    out.reserve(usize::try_from(chunks_len(&chunks)).unwrap_or(0));
    for (_, chunk) in &chunks {
        out.extend(chunk.iter());
    }
}

/// The postings of an `and` of terms (`None` for a term no row has),
/// inline while there are few.
pub type Postings<'b> = SmallVec<[Option<&'b Posting>; 16]>;

/// A query decoded for evaluation: an `and` of terms (the common search,
/// with no plan tree to build) or any other expression's plan.
pub enum Query<'b> {
    Terms(Postings<'b>),
    Plan(Plan<'b>),
}

/// Decodes `term` into a `Query`: `{:and, [t1, t2, ...]}` whose operands are
/// all terms (no operator) is looked up directly; anything else is `plan`ned.
/// The work counted is the same either way.
pub fn prepare<'b>(
    bitmaps: &'b Bitmaps,
    term: Term,
    key: &mut Vec<u8>,
    budget: &mut Budget,
) -> Result<Query<'b>, NativeError> {
    if let Node::List { and: true, list } = node(term) {
        let mut postings: Postings = SmallVec::new();
        let mut rest = list;
        let mut terms = true;
        while let Some(Ok(operand)) = next_cell(&mut rest) {
            match node(operand) {
                Node::Leaf(leaf_term) => {
                    budget.spend(1)?;
                    key.clear();
                    encode(leaf_term, key, budget)?;
                    postings.push(bitmaps.get(key.as_slice()).map(Arc::as_ref));
                }
                _ => {
                    terms = false;
                    break;
                }
            }
        }
        // An improper list or an empty `and` goes through `plan`, which
        // answers the error or the universe.
        if terms && rest.is_empty_list() && !postings.is_empty() {
            budget.spend(1)?;
            return Ok(Query::Terms(postings));
        }
    }
    Ok(Query::Plan(plan(bitmaps, term, key, budget)?))
}

/// `estimate` for a `Query`.
pub fn estimate_query(state: &State, query: &Query) -> (u64, u64) {
    match query {
        Query::Plan(plan) => estimate(state, plan),
        Query::Terms(postings) => postings.iter().fold((0, u64::MAX), |(w, n), posting| {
            let (cw, cn) = posting.map_or((0, 0), |p| (p.chunks.len() as u64, p.len));
            (w.saturating_add(cw), n.min(cn))
        }),
    }
}

/// `eval_ids` for a `Query`.
pub fn eval_query_ids<'b>(bitmaps: &'b Bitmaps, query: &Query<'b>, out: &mut Vec<u32>) {
    match query {
        Query::Plan(plan) => eval_ids(bitmaps, plan, out),
        Query::Terms(postings) => {
            out.clear();
            and_of_terms(postings, out);
        }
    }
}

/// Seeks per operand a chunk of an `and` of terms may spend leapfrogging
/// before it intersects the whole containers instead: a seek costs about as
/// much as a few words of a container intersection, and a bitmap container
/// has 1,024 words.
const LEAP_SEEKS: usize = 128;

/// The ids of `and(children)` when every child is a term (`None` otherwise),
/// chunk by chunk of the smallest posting. Only the span every operand's
/// chunk covers (their first and last ids, kept by the writer) can match.
/// Within it the chunks are leapfrogged: each operand's cursor seeks the
/// largest id any cursor stands on, until all stand on the same one, which
/// matches; no container is copied, and an operand whose ids come in blocks
/// skips a whole block at once. When that takes more than `LEAP_SEEKS` seeks
/// per operand (large answers), the chunks are intersected whole instead,
/// smallest first.
fn and_of_terms(operands: &[Option<&Posting>], out: &mut Vec<u32>) {
    let mut postings: SmallVec<[&Posting; 16]> = SmallVec::with_capacity(operands.len());
    for operand in operands {
        match operand {
            Some(posting) => postings.push(posting),
            None => return,
        }
    }
    let Some((first_at, first)) = postings
        .iter()
        .enumerate()
        .min_by_key(|(_, posting)| posting.len)
    else {
        return;
    };
    let mut chunks: SmallVec<[&Chunk; 16]> = SmallVec::with_capacity(postings.len());
    let mut cursors: SmallVec<[Cursor; 16]> = SmallVec::with_capacity(postings.len());
    'chunks: for (key, mine) in &first.chunks {
        chunks.clear();
        chunks.push(mine);
        let (mut lo, mut hi) = (mine.lo, mine.hi);
        for (at, posting) in postings.iter().enumerate() {
            if at == first_at {
                continue;
            }
            match posting.chunk(*key) {
                Some(chunk) => {
                    lo = lo.max(chunk.lo);
                    hi = hi.min(chunk.hi);
                    chunks.push(chunk);
                }
                None => continue 'chunks,
            }
        }
        if lo > hi {
            continue;
        }
        chunks.sort_unstable_by_key(|chunk| chunk.ids.len());
        let seeks = LEAP_SEEKS.saturating_mul(chunks.len());
        if leapfrog(&chunks, lo, hi, &mut cursors, seeks, out) {
            continue;
        }
        let Some((smallest, rest)) = chunks.split_first() else {
            continue;
        };
        let Some((second, others)) = rest.split_first() else {
            out.extend(smallest.ids.range(lo..=hi));
            continue;
        };
        let mut ids = &smallest.ids & &second.ids;
        for chunk in others {
            if ids.is_empty() {
                continue 'chunks;
            }
            ids &= &chunk.ids;
        }
        out.extend(ids.iter());
    }
}

/// A chunk's cursor for `leapfrog`: its ids in the span, and the id it
/// stands on.
type Cursor<'c> = (roaring::bitmap::Iter<'c>, u32);

/// Appends to `out` the ids in `lo..=hi` that every chunk holds, in order,
/// by leapfrogging; `cursors` is scratch space. Answers `false` (and leaves
/// `out` as it was) after `seeks` seeks without reaching the end.
fn leapfrog<'c>(
    chunks: &[&'c Chunk],
    lo: u32,
    hi: u32,
    cursors: &mut SmallVec<[Cursor<'c>; 16]>,
    seeks: usize,
    out: &mut Vec<u32>,
) -> bool {
    cursors.clear();
    let mut target = lo;
    for chunk in chunks {
        let mut ids = chunk.ids.iter();
        ids.advance_to(lo);
        match ids.next() {
            Some(id) if id <= hi => {
                target = target.max(id);
                cursors.push((ids, id));
            }
            _ => return true,
        }
    }
    let (start, k) = (out.len(), cursors.len());
    let (mut agree, mut left) = (0, seeks);
    loop {
        for (ids, at) in cursors.iter_mut() {
            if *at < target {
                let Some(l) = left.checked_sub(1) else {
                    out.truncate(start);
                    return false;
                };
                left = l;
                ids.advance_to(target);
                match ids.next() {
                    Some(id) if id <= hi => *at = id,
                    _ => return true,
                }
            }
            // `agree` counts the cursors in a row (this one included) that
            // stand on `target`.
            if *at > target {
                target = *at;
                agree = 0;
            }
            agree += 1;
            if agree == k {
                out.push(target);
                match target.checked_add(1) {
                    Some(next) if next <= hi => target = next,
                    _ => return true,
                }
                agree = 0;
            }
        }
    }
}

/// The ids of `and(children)` by probing, if its smallest positive
/// operand is a posting of at most `PROBE_IDS` ids.
fn probe_and<'b>(bitmaps: &'b Bitmaps, children: &[Plan<'b>]) -> Option<Vec<u32>> {
    let mut smallest: Option<&Posting> = None;
    for child in children {
        match child {
            Plan::Leaf(None) => return Some(Vec::new()),
            Plan::Leaf(Some(posting)) if smallest.is_none_or(|s| posting.len < s.len) => {
                smallest = Some(posting);
            }
            _ => {}
        }
    }
    let smallest = smallest?;
    if smallest.len > PROBE_IDS {
        return None;
    }
    let mut positives: Vec<Set<'b>> = Vec::with_capacity(children.len());
    let mut negatives: Vec<Set<'b>> = Vec::new();
    let mut skipped = false;
    for child in children {
        match child {
            Plan::Leaf(Some(posting)) if !skipped && std::ptr::eq(*posting, smallest) => {
                skipped = true;
            }
            Plan::Not(inner) => negatives.push(set(bitmaps, inner)),
            other => positives.push(set(bitmaps, other)),
        }
    }
    let mut out = Vec::new();
    Set::Posting(smallest).for_each(|id| {
        if positives.iter().all(|set| set.contains(id))
            && !negatives.iter().any(|set| set.contains(id))
        {
            out.push(id);
        }
    });
    Some(out)
}

/// Intersects the positive children smallest first, chunk by chunk of the
/// smallest, dropping a chunk as soon as it is empty, then subtracts the
/// negated ones.
fn eval_and<'b>(bitmaps: &'b Bitmaps, children: &[Plan<'b>]) -> Chunks<'b> {
    let mut positives: Vec<Set<'b>> = Vec::with_capacity(children.len());
    let mut negatives: Vec<&Plan> = Vec::new();
    for child in children {
        match child {
            Plan::Not(inner) => negatives.push(inner),
            Plan::Leaf(None) => return Vec::new(),
            other => positives.push(set(bitmaps, other)),
        }
    }
    positives.sort_by_key(Set::len);
    let mut acc = match positives.split_first_mut() {
        None => universe(bitmaps),
        Some((Set::Posting(first), rest)) => {
            let first = first
                .chunks
                .iter()
                .map(|(key, chunk)| (*key, Cow::Borrowed(&chunk.ids)));
            intersect(first, rest)
        }
        Some((Set::Chunks(first), rest)) => intersect(std::mem::take(first).into_iter(), rest),
    };
    for negative in negatives {
        if acc.is_empty() {
            break;
        }
        subtract(&mut acc, &set(bitmaps, negative));
    }
    acc
}

/// The chunks of `first` that every set of `rest` also holds. Within each
/// chunk the operands are intersected smallest first (by their ids in that
/// chunk, not in the whole posting), so the running result shrinks as early
/// as it can; a chunk is dropped as soon as it is empty.
fn intersect<'b>(
    first: impl Iterator<Item = (u16, Cow<'b, RoaringBitmap>)>,
    rest: &[Set<'b>],
) -> Chunks<'b> {
    let mut acc = Vec::new();
    let mut theirs: Vec<&RoaringBitmap> = Vec::with_capacity(rest.len());
    'chunks: for (key, mine) in first {
        theirs.clear();
        for other in rest {
            match other.find(key) {
                Some(ids) => theirs.push(ids),
                None => continue 'chunks,
            }
        }
        theirs.sort_unstable_by_key(|ids| ids.len());
        let mut ids = match mine {
            Cow::Owned(mine) => mine,
            Cow::Borrowed(mine) if theirs.is_empty() => {
                acc.push((key, Cow::Borrowed(mine)));
                continue 'chunks;
            }
            Cow::Borrowed(mine) => {
                // The smaller operand goes first: `&` copies it.
                let smallest = theirs.remove(0);
                if smallest.len() < mine.len() {
                    smallest & mine
                } else {
                    mine & smallest
                }
            }
        };
        for other in &theirs {
            if ids.is_empty() {
                continue 'chunks;
            }
            ids &= *other;
        }
        if !ids.is_empty() {
            acc.push((key, Cow::Owned(ids)));
        }
    }
    acc
}

/// An upper bound on the work a plan costs: `(containers touched, ids
/// returned)`. Recursion follows the plan, bounded by `MAX_DEPTH`.
pub fn estimate(state: &State, plan: &Plan) -> (u64, u64) {
    match plan {
        Plan::Leaf(Some(posting)) => (posting.chunks.len() as u64, posting.len),
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
