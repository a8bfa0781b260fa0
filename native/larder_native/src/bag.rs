//! The fingerprint set of `Larder.Bag`: the 64-bit fingerprints of the pairs
//! a bag holds, in shards that match the bag's lock slots. Elixir computes
//! the fingerprints (`Larder.Bag.Store`); this only counts them, so every
//! call is O(fingerprints passed) and touches no user term.
//!
//! A fingerprint is `key_hash << 32 | value_hash`; its shard is
//! `key_hash % shards`, the lock slot of the key (minus one), so the writer
//! that holds a key's slot is the only one that changes its shard and a
//! shard can be rebuilt from the table while its slot is held.

use rustler::{Encoder, Env, NifResult, ResourceArc, Term};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The most fingerprints one batch call takes (Elixir passes longer lists
/// in chunks): about 100 µs of work. Every call that changes the set runs
/// on a normal scheduler and answers `:dirty`, changing nothing, when it
/// could resize a table of BIG_TABLE buckets or more; its `_dirty` variant
/// then does the work on a dirty scheduler.
const MAX_BATCH: usize = 4_096;
/// The most shards a set can have (`Larder.Lock`'s slot limit).
const MAX_SHARDS: u32 = 1 << 20;
/// A table this large (512 KiB) is resized only on a dirty scheduler.
const BIG_TABLE: usize = 1 << 16;

/// The hasher of the collision counts: fingerprints are uniform already, one
/// multiply spreads the pair hash (low bits) into the high bits.
#[derive(Default, Clone, Copy)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Build = BuildHasherDefault<Mix>;

/// A set of u64 in one array, open addressing with linear probing: a
/// lookup or an insert reads one cache line in the common case (a table
/// with separate control bytes reads two). 0 marks a free bucket; the
/// fingerprint 0 is kept in `zero`. The table grows past 3/4 full and
/// shrinks below 1/8, so memory follows deletes.
#[derive(Default)]
struct Open {
    buckets: Vec<u64>,
    len: usize,
    zero: bool,
}

impl Open {
    fn home(&self, fp: u64) -> usize {
        // Fibonacci hashing: the high bits of the product spread every bit.
        let bits = self.buckets.len().trailing_zeros();
        (fp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    fn len(&self) -> usize {
        self.len + usize::from(self.zero)
    }

    fn bytes(&self) -> usize {
        self.buckets.len() * 8
    }

    /// Whether an insert (`grow`) or a removal would copy a table of
    /// BIG_TABLE buckets or more: too long for a normal scheduler.
    fn big_resize(&self, grow: bool) -> bool {
        let n = self.buckets.len();
        n >= BIG_TABLE
            && if grow {
                (self.len + 1) * 4 > n * 3
            } else {
                self.len.saturating_sub(1) * 8 < n
            }
    }

    /// Inserts `fp`; whether it was absent.
    fn insert(&mut self, fp: u64) -> bool {
        if fp == 0 {
            return !std::mem::replace(&mut self.zero, true);
        }
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.resize((self.buckets.len() * 2).max(16));
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(fp);
        loop {
            match self.buckets[i] {
                0 => {
                    self.buckets[i] = fp;
                    self.len += 1;
                    return true;
                }
                x if x == fp => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Removes `fp`; whether it was present.
    fn remove(&mut self, fp: u64) -> bool {
        if fp == 0 {
            return std::mem::replace(&mut self.zero, false);
        }
        if self.buckets.is_empty() {
            return false;
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(fp);
        loop {
            match self.buckets[i] {
                0 => return false,
                x if x == fp => break,
                _ => i = (i + 1) & mask,
            }
        }
        // Backward-shift deletion: move later members of the probe run into
        // the hole when their home does not lie between the hole and them.
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let x = self.buckets[j];
            if x == 0 {
                break;
            }
            let home = self.home(x);
            let between = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !between {
                self.buckets[i] = x;
                i = j;
            }
        }
        self.buckets[i] = 0;
        self.len -= 1;
        if self.len == 0 {
            self.buckets = Vec::new();
        } else if self.buckets.len() > 16 && self.len * 8 < self.buckets.len() {
            self.resize(self.buckets.len() / 2);
        }
        true
    }

    fn resize(&mut self, size: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![0; size]);
        let mask = size - 1;
        for fp in old.into_iter().filter(|&fp| fp != 0) {
            let mut i = self.home(fp);
            while self.buckets[i] != 0 {
                i = (i + 1) & mask;
            }
            self.buckets[i] = fp;
        }
    }
}

/// The fingerprints of one lock slot. `one` holds every fingerprint present;
/// `more` counts the extra pairs of a fingerprint held by several pairs (a
/// collision), so that deleting one of them keeps it.
#[derive(Default)]
struct Shard {
    one: Open,
    more: HashMap<u64, u32, Build>,
}

impl Shard {
    fn bytes(&self) -> usize {
        // hashbrown: one control byte per bucket plus the entry.
        self.one.bytes() + self.more.capacity() * 17
    }

    /// Adds `fp` if it is absent; whether it was.
    fn add(&mut self, fp: u64) -> bool {
        self.one.insert(fp)
    }

    /// Counts one more pair under `fp`.
    fn incr(&mut self, fp: u64) {
        if !self.one.insert(fp) {
            *self.more.entry(fp).or_insert(0) += 1;
        }
    }

    /// Counts one pair less under `fp`.
    fn remove(&mut self, fp: u64) {
        match self.more.get_mut(&fp) {
            Some(extra) if *extra > 1 => *extra -= 1,
            Some(_) => {
                self.more.remove(&fp);
            }
            None => {
                self.one.remove(fp);
            }
        }
        if self.more.is_empty() && self.more.capacity() > 0 {
            self.more.shrink_to(0);
        }
    }
}

pub struct FpSet {
    shards: Box<[Mutex<Shard>]>,
    /// Bytes of every shard's tables, kept up to date by each call.
    bytes: AtomicUsize,
}

#[rustler::resource_impl]
impl rustler::Resource for FpSet {}

impl FpSet {
    fn shard(&self, fp: u64) -> MutexGuard<'_, Shard> {
        let i = ((fp >> 32) % self.shards.len() as u64) as usize;
        // A shard's writers hold its lock slot in Elixir, so this mutex is
        // never contended; no code panics while holding it, and a poisoned
        // one would still hold consistent counts.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on `fp`'s shard and accounts for a change in its size.
    fn with<R>(&self, fp: u64, f: impl FnOnce(&mut Shard) -> R) -> R {
        let mut shard = self.shard(fp);
        let before = shard.bytes();
        let result = f(&mut shard);
        let after = shard.bytes();
        if after > before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else if after < before {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
        result
    }
}

/// The set behind a handle, borrowed for the call (the caller's term keeps
/// it alive; no reference count is touched).
fn set<'a>(term: Term<'a>) -> NifResult<&'a FpSet> {
    term.try_get_resource::<FpSet>()
        .ok_or(rustler::Error::BadArg)
}

/// A set with `shards` shards (1..2^20).
#[rustler::nif]
fn bag_fps_new(shards: u32) -> NifResult<ResourceArc<FpSet>> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(rustler::Error::BadArg);
    }
    let shards: Box<[Mutex<Shard>]> = (0..shards).map(|_| Mutex::default()).collect();
    Ok(ResourceArc::new(FpSet {
        shards,
        bytes: AtomicUsize::new(0),
    }))
}

/// The fingerprint of a key hash and a value hash.
fn join(key_hash: u32, value_hash: u32) -> u64 {
    u64::from(key_hash) << 32 | u64::from(value_hash)
}

/// One change to a single fingerprint.
#[derive(Clone, Copy)]
enum Op {
    Add,
    Incr,
    Remove,
}

/// Applies `op` to the fingerprint; on a normal scheduler (`dirty == false`)
/// answers `:dirty`, changing nothing, when it would resize a big table.
fn single<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    fp: u64,
    op: Op,
    dirty: bool,
) -> NifResult<Term<'a>> {
    let result = set(set_term)?.with(fp, |shard| {
        if !dirty && shard.one.big_resize(!matches!(op, Op::Remove)) {
            return None;
        }
        Some(match op {
            Op::Add => shard.add(fp).encode(env),
            Op::Incr => {
                shard.incr(fp);
                crate::atoms::ok().encode(env)
            }
            Op::Remove => {
                shard.remove(fp);
                crate::atoms::ok().encode(env)
            }
        })
    });
    Ok(result.unwrap_or_else(|| crate::atoms::dirty().encode(env)))
}

/// Adds the fingerprint if absent: `true` if it was absent (the pair is
/// new), `false` if present (the pair, or one colliding with it, is there;
/// nothing is counted); `:dirty` if that needs `bag_fps_add_dirty/3`. The
/// fingerprint comes as its key hash and value hash, small integers in
/// Erlang.
#[rustler::nif]
fn bag_fps_add<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Add, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_add_dirty<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Add, true)
}

/// Counts one more pair under the fingerprint, present or not: `:ok`, or
/// `:dirty` if that needs `bag_fps_incr_dirty/3`.
#[rustler::nif]
fn bag_fps_incr<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Incr, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_incr_dirty<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Incr, true)
}

/// Counts one pair less under the fingerprint: `:ok`, or `:dirty` if that
/// needs `bag_fps_remove_dirty/3`.
#[rustler::nif]
fn bag_fps_remove<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Remove, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_remove_dirty<'a>(
    env: Env<'a>,
    set: Term<'a>,
    key_hash: u32,
    value_hash: u32,
) -> NifResult<Term<'a>> {
    single(env, set, join(key_hash, value_hash), Op::Remove, true)
}

fn batch(fps: Vec<u64>) -> NifResult<Vec<u64>> {
    if fps.len() > MAX_BATCH {
        Err(rustler::Error::BadArg)
    } else {
        Ok(fps)
    }
}

/// Whether applying a batch of `fps` could resize a big table: a shard it
/// touches is big and the whole batch landing in it would cross a resize
/// threshold (adding when `grow`, removing otherwise). Conservative.
fn big_batch(set: &FpSet, fps: &[u64], grow: bool) -> bool {
    let n = fps.len();
    fps.iter().any(|&fp| {
        let shard = set.shard(fp);
        let (len, buckets) = (shard.one.len, shard.one.buckets.len());
        buckets >= BIG_TABLE
            && if grow {
                (len + n) * 4 > buckets * 3
            } else {
                len.saturating_sub(n) * 8 < buckets
            }
    })
}

fn incr_many<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    fps: Vec<u64>,
    dirty: bool,
) -> NifResult<Term<'a>> {
    let set = set(set_term)?;
    let fps = batch(fps)?;
    if !dirty && big_batch(set, &fps, true) {
        return Ok(crate::atoms::dirty().encode(env));
    }
    for fp in fps {
        set.with(fp, |shard| shard.incr(fp));
    }
    Ok(crate::atoms::ok().encode(env))
}

fn remove_many<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    fps: Vec<u64>,
    dirty: bool,
) -> NifResult<Term<'a>> {
    let set = set(set_term)?;
    let fps = batch(fps)?;
    if !dirty && big_batch(set, &fps, false) {
        return Ok(crate::atoms::dirty().encode(env));
    }
    for fp in fps {
        set.with(fp, |shard| shard.remove(fp));
    }
    Ok(crate::atoms::ok().encode(env))
}

/// `bag_fps_incr/3` over a list of whole fingerprints (at most 4,096):
/// `:ok`, or `:dirty` if it could resize a big table (then call
/// `bag_fps_incr_many_dirty/2`).
#[rustler::nif]
fn bag_fps_incr_many<'a>(env: Env<'a>, set: Term<'a>, fps: Vec<u64>) -> NifResult<Term<'a>> {
    incr_many(env, set, fps, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_incr_many_dirty<'a>(env: Env<'a>, set: Term<'a>, fps: Vec<u64>) -> NifResult<Term<'a>> {
    incr_many(env, set, fps, true)
}

/// `bag_fps_remove/3` over a list of whole fingerprints (at most 4,096):
/// `:ok`, or `:dirty` as `bag_fps_incr_many/2`.
#[rustler::nif]
fn bag_fps_remove_many<'a>(env: Env<'a>, set: Term<'a>, fps: Vec<u64>) -> NifResult<Term<'a>> {
    remove_many(env, set, fps, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_remove_many_dirty<'a>(
    env: Env<'a>,
    set: Term<'a>,
    fps: Vec<u64>,
) -> NifResult<Term<'a>> {
    remove_many(env, set, fps, true)
}

/// Empties shard `index` (0-based), before it is rebuilt from the table
/// (freeing a table is one deallocation).
#[rustler::nif]
fn bag_fps_clear(set_term: Term, index: u32) -> NifResult<rustler::Atom> {
    let set = set(set_term)?;
    let index = index as usize;
    if index >= set.shards.len() {
        return Err(rustler::Error::BadArg);
    }
    let mut shard = set.shards[index].lock().unwrap_or_else(|e| e.into_inner());
    let before = shard.bytes();
    *shard = Shard::default();
    set.bytes.fetch_sub(before, Ordering::Relaxed);
    Ok(crate::atoms::ok())
}

/// Bytes the set holds: its tables and its shards' fixed part. O(1).
#[rustler::nif]
fn bag_fps_memory(set_term: Term) -> NifResult<usize> {
    let set = set(set_term)?;
    Ok(std::mem::size_of::<FpSet>()
        + set.shards.len() * std::mem::size_of::<Mutex<Shard>>()
        + set.bytes.load(Ordering::Relaxed))
}

/// The number of pairs counted (for tests). O(shards), so dirty.
#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_count(set_term: Term) -> NifResult<usize> {
    Ok(set(set_term)?
        .shards
        .iter()
        .map(|s| {
            let shard = s.lock().unwrap_or_else(|e| e.into_inner());
            shard.one.len() + shard.more.values().map(|&n| n as usize).sum::<usize>()
        })
        .sum())
}

fn add_bin<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    bin: rustler::Binary<'a>,
    dirty: bool,
) -> NifResult<Term<'a>> {
    let set = set(set_term)?;
    if !bin.len().is_multiple_of(8) || bin.len() > MAX_BATCH * 8 {
        return Err(rustler::Error::BadArg);
    }
    let fps: Vec<u64> = bin
        .as_slice()
        .chunks_exact(8)
        .map(|bytes| {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            u64::from_be_bytes(word)
        })
        .collect();
    if !dirty && big_batch(set, &fps, true) {
        return Ok(crate::atoms::dirty().encode(env));
    }
    let present: Vec<usize> = fps
        .iter()
        .enumerate()
        .filter(|&(_, &fp)| !set.with(fp, |shard| shard.add(fp)))
        .map(|(i, _)| i)
        .collect();
    Ok(present.encode(env))
}

/// `bag_fps_add/3` over a binary of big-endian u64 fingerprints (at most
/// 4,096 of them): the 0-based positions of those that were present, in
/// order (`[]` when all were new; a fingerprint repeated in the binary is
/// present at its second position), or `:dirty`, changing nothing, if it
/// could resize a big table (then call `bag_fps_add_bin_dirty/2`).
#[rustler::nif]
fn bag_fps_add_bin<'a>(
    env: Env<'a>,
    set: Term<'a>,
    fps: rustler::Binary<'a>,
) -> NifResult<Term<'a>> {
    add_bin(env, set, fps, false)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn bag_fps_add_bin_dirty<'a>(
    env: Env<'a>,
    set: Term<'a>,
    fps: rustler::Binary<'a>,
) -> NifResult<Term<'a>> {
    add_bin(env, set, fps, true)
}

/// The sorted distinct lock slots (1-based, among `slots`) of the keys of a
/// binary of big-endian u64 fingerprints (at most 4,096 of them).
#[rustler::nif]
fn bag_fps_slots(fps: rustler::Binary, slots: u32) -> NifResult<Vec<u32>> {
    if slots == 0 || !fps.len().is_multiple_of(8) || fps.len() > MAX_BATCH * 8 {
        return Err(rustler::Error::BadArg);
    }
    let mut used: Vec<u32> = fps
        .as_slice()
        .chunks_exact(8)
        .map(|bytes| {
            let key_hash = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            key_hash % slots + 1
        })
        .collect();
    used.sort_unstable();
    used.dedup();
    Ok(used)
}
