//! The fingerprint set of `Larder.Bag`: the fingerprints of the pairs a bag
//! holds, in shards that match the bag's lock slots. Elixir computes the
//! fingerprints (`Larder.Bag.Fingerprint`); this only counts them, so every
//! call is O(fingerprints passed) and touches no user term.
//!
//! A fingerprint is `key_hash << 32 | value_hash`; its shard is
//! `key_hash % shards`, the lock slot of the key (minus one), so the writer
//! that holds a key's slot is the only one that changes its shard and a
//! shard can be rebuilt from the table while its slot is held. A shard keeps
//! 32 bits of each fingerprint (`reduce`): half the memory, so a random
//! insert reads a smaller table.

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
/// The most shards a set can have (a bag has 256): a batch call keeps a
/// word per shard.
const MAX_SHARDS: u32 = 1 << 16;
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

/// The 32 bits a shard keeps of a fingerprint: the high half of a 64-bit
/// mix (MurmurHash3's finaliser) of all 64 bits. Two distinct fingerprints
/// of one shard keep the same 32 bits with probability 2^-32; they then
/// count as one in `Open` (the `more` counts keep deletes right), and the
/// caller's exact check tells their pairs apart.
fn reduce(fp: u64) -> u32 {
    let mut x = fp;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    (x >> 32) as u32
}

/// Asks the CPU to start loading the cache line at `p` (a hint: no effect on
/// what the program computes).
#[inline(always)]
fn prefetch(p: *const u32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees,
    // whatever the address.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A set of u32 in one array, open addressing with linear probing: a
/// lookup or an insert reads one cache line in the common case. 0 marks a
/// free bucket; the value 0 is kept in `zero`. A value's home bucket comes
/// from its high bits, so resizing needs nothing but the values. The table
/// grows past 3/4 full and shrinks below 1/8, so memory follows deletes.
#[derive(Default)]
struct Open {
    buckets: Vec<u32>,
    len: usize,
    zero: bool,
}

impl Open {
    fn home(&self, x: u32) -> usize {
        // The values are uniform: their high bits pick the bucket.
        ((u128::from(x) * self.buckets.len() as u128) >> 32) as usize
    }

    /// Where a lookup of `x` starts reading (for a prefetch).
    fn home_ptr(&self, x: u32) -> *const u32 {
        match self.buckets.len() {
            0 => std::ptr::null(),
            _ => self.buckets[self.home(x)..].as_ptr(),
        }
    }

    fn len(&self) -> usize {
        self.len + usize::from(self.zero)
    }

    fn bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<u32>()
    }

    /// Inserts `x`; whether it was absent.
    fn insert(&mut self, x: u32) -> bool {
        if x == 0 {
            return !std::mem::replace(&mut self.zero, true);
        }
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.resize((self.buckets.len() * 2).max(16));
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(x);
        loop {
            match self.buckets[i] {
                0 => {
                    self.buckets[i] = x;
                    self.len += 1;
                    return true;
                }
                y if y == x => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Removes `x`; whether it was present.
    fn remove(&mut self, x: u32) -> bool {
        if x == 0 {
            return std::mem::replace(&mut self.zero, false);
        }
        if self.buckets.is_empty() {
            return false;
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(x);
        loop {
            match self.buckets[i] {
                0 => return false,
                y if y == x => break,
                _ => i = (i + 1) & mask,
            }
        }
        // Backward-shift deletion: move later members of the probe run into
        // the hole when their home does not lie between the hole and them.
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let y = self.buckets[j];
            if y == 0 {
                break;
            }
            let home = self.home(y);
            let between = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !between {
                self.buckets[i] = y;
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
        for x in old.into_iter().filter(|&x| x != 0) {
            let mut i = self.home(x);
            while self.buckets[i] != 0 {
                i = (i + 1) & mask;
            }
            self.buckets[i] = x;
        }
    }
}

/// The fingerprints of one lock slot, by their 32 kept bits. `one` holds
/// every value present; `more` counts the extra pairs of a value held by
/// several pairs (a collision), so that deleting one of them keeps it.
#[derive(Default)]
struct Shard {
    one: Open,
    more: HashMap<u32, u32, Build>,
}

impl Shard {
    fn bytes(&self) -> usize {
        // hashbrown: one control byte per bucket plus the entry.
        self.one.bytes() + self.more.capacity() * 9
    }

    /// Whether `n` changes of kind `op` could resize a table of BIG_TABLE
    /// buckets or more: too long for a normal scheduler.
    fn heavy(&self, op: Op, n: usize) -> bool {
        let size = self.one.buckets.len();
        size >= BIG_TABLE
            && if op.grows() {
                (self.one.len + n) * 4 > size * 3
            } else {
                self.one.len.saturating_sub(n) * 8 < size
            }
    }

    /// Starts loading the bucket an operation on `x` reads first.
    fn prefetch(&self, x: u32) {
        prefetch(self.one.home_ptr(x));
    }

    /// Adds `x` if it is absent; whether it was.
    fn add(&mut self, x: u32) -> bool {
        self.one.insert(x)
    }

    /// Counts one more pair under `x`.
    fn incr(&mut self, x: u32) {
        if !self.one.insert(x) {
            *self.more.entry(x).or_insert(0) += 1;
        }
    }

    /// Counts one pair less under `x`.
    fn remove(&mut self, x: u32) {
        match self.more.get_mut(&x) {
            Some(extra) if *extra > 1 => *extra -= 1,
            Some(_) => {
                self.more.remove(&x);
            }
            None => {
                self.one.remove(x);
            }
        }
        if self.more.is_empty() && self.more.capacity() > 0 {
            self.more.shrink_to(0);
        }
    }

    fn apply(&mut self, op: Op, x: u32) -> bool {
        match op {
            Op::Add => self.add(x),
            Op::Incr => {
                self.incr(x);
                true
            }
            Op::Remove => {
                self.remove(x);
                true
            }
        }
    }
}

/// One change to a fingerprint.
#[derive(Clone, Copy)]
enum Op {
    /// Adds it if absent (whether it was).
    Add,
    /// Counts one more pair under it.
    Incr,
    /// Counts one pair less under it.
    Remove,
}

impl Op {
    fn grows(self) -> bool {
        !matches!(self, Op::Remove)
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
    fn index(&self, fp: u64) -> usize {
        ((fp >> 32) % self.shards.len() as u64) as usize
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A shard's writers hold its lock slot in Elixir, so this mutex is
        // never contended; no code panics while holding it, and a poisoned
        // one would still hold consistent counts.
        self.shards[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn account(&self, before: usize, after: usize) {
        if after > before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else if after < before {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Applies `op` to `fp`. On a normal scheduler (`dirty == false`),
    /// `None`, changing nothing, when that could resize a big table.
    fn single(&self, fp: u64, op: Op, dirty: bool) -> Option<bool> {
        let mut shard = self.lock(self.index(fp));
        if !dirty && shard.heavy(op, 1) {
            return None;
        }
        let before = shard.bytes();
        let result = shard.apply(op, reduce(fp));
        self.account(before, shard.bytes());
        Some(result)
    }

    /// Applies `op` to every fingerprint of `fps` in order, calling
    /// `each(position, result)`. Locks the shards the batch touches once,
    /// in increasing order, and prefetches the bucket of the fingerprint a
    /// few places ahead, so the cache misses of a batch overlap. On a
    /// normal scheduler (`dirty == false`), `None`, changing nothing, when
    /// the batch could resize a big table.
    fn batch(
        &self,
        fps: &[u64],
        op: Op,
        dirty: bool,
        mut each: impl FnMut(usize, bool),
    ) -> Option<()> {
        const AHEAD: usize = 8;
        const NONE: u32 = u32::MAX;
        // How many fingerprints go to each shard, then each shard's place
        // among the locked ones.
        let mut place: Vec<u32> = vec![0; self.shards.len()];
        for &fp in fps {
            place[self.index(fp)] += 1;
        }
        let mut guards: Vec<MutexGuard<'_, Shard>> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        for (index, slot) in place.iter_mut().enumerate() {
            if *slot == 0 {
                *slot = NONE;
            } else {
                counts.push(*slot as usize);
                *slot = guards.len() as u32;
                guards.push(self.lock(index));
            }
        }
        if !dirty
            && guards
                .iter()
                .zip(&counts)
                .any(|(shard, &n)| shard.heavy(op, n))
        {
            return None;
        }
        let at: Vec<(usize, u32)> = fps
            .iter()
            .map(|&fp| (place[self.index(fp)] as usize, reduce(fp)))
            .collect();
        let before: usize = guards.iter().map(|shard| shard.bytes()).sum();
        for (i, &(g, x)) in at.iter().enumerate() {
            if let Some(&(ahead, y)) = at.get(i + AHEAD) {
                guards[ahead].prefetch(y);
            }
            each(i, guards[g].apply(op, x));
        }
        let after: usize = guards.iter().map(|shard| shard.bytes()).sum();
        self.account(before, after);
        Some(())
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

/// Applies `op` to one fingerprint: `op`'s answer (`Op::Add`'s boolean,
/// `:ok` for the others), or `:dirty` when, on a normal scheduler, that
/// could resize a big table.
fn single<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    fp: u64,
    op: Op,
    dirty: bool,
) -> NifResult<Term<'a>> {
    Ok(match set(set_term)?.single(fp, op, dirty) {
        None => crate::atoms::dirty().encode(env),
        Some(new) if matches!(op, Op::Add) => new.encode(env),
        Some(_) => crate::atoms::ok().encode(env),
    })
}

/// Declares the NIF `$name` that applies `$op` to one fingerprint, given as
/// its key hash and value hash (small integers in Erlang), on a normal
/// scheduler, answering `:dirty` when that could resize a big table; and
/// `$dirty`, the same on a dirty scheduler.
macro_rules! single_nifs {
    ($(#[$doc:meta])* $name:ident, $dirty:ident, $op:expr) => {
        $(#[$doc])*
        #[rustler::nif]
        fn $name<'a>(
            env: Env<'a>,
            set: Term<'a>,
            key_hash: u32,
            value_hash: u32,
        ) -> NifResult<Term<'a>> {
            single(env, set, join(key_hash, value_hash), $op, false)
        }

        #[rustler::nif(schedule = "DirtyCpu")]
        fn $dirty<'a>(
            env: Env<'a>,
            set: Term<'a>,
            key_hash: u32,
            value_hash: u32,
        ) -> NifResult<Term<'a>> {
            single(env, set, join(key_hash, value_hash), $op, true)
        }
    };
}

single_nifs!(
    /// Adds the fingerprint if absent: `true` if it was absent (the pair is
    /// new), `false` if present (the pair, or one colliding with it, is
    /// there; nothing is counted); `:dirty` if that needs
    /// `bag_fps_add_dirty/3`.
    bag_fps_add,
    bag_fps_add_dirty,
    Op::Add
);

single_nifs!(
    /// Counts one more pair under the fingerprint, present or not: `:ok`, or
    /// `:dirty` if that needs `bag_fps_incr_dirty/3`.
    bag_fps_incr,
    bag_fps_incr_dirty,
    Op::Incr
);

single_nifs!(
    /// Counts one pair less under the fingerprint: `:ok`, or `:dirty` if
    /// that needs `bag_fps_remove_dirty/3`.
    bag_fps_remove,
    bag_fps_remove_dirty,
    Op::Remove
);

/// The fingerprints of a binary of big-endian u64 (at most MAX_BATCH).
fn decode(bin: &rustler::Binary) -> NifResult<Vec<u64>> {
    if !bin.len().is_multiple_of(8) || bin.len() > MAX_BATCH * 8 {
        return Err(rustler::Error::BadArg);
    }
    Ok(bin
        .as_slice()
        .chunks_exact(8)
        .map(|bytes| {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            u64::from_be_bytes(word)
        })
        .collect())
}

/// Applies `op` to a batch of fingerprints: `:ok`, or `:dirty` when, on a
/// normal scheduler, that could resize a big table.
fn many<'a>(
    env: Env<'a>,
    set_term: Term<'a>,
    fps: Vec<u64>,
    op: Op,
    dirty: bool,
) -> NifResult<Term<'a>> {
    let set = set(set_term)?;
    if fps.len() > MAX_BATCH {
        return Err(rustler::Error::BadArg);
    }
    Ok(match set.batch(&fps, op, dirty, |_, _| ()) {
        Some(()) => crate::atoms::ok().encode(env),
        None => crate::atoms::dirty().encode(env),
    })
}

/// Declares the NIF `$name` that applies `$op` to a list of whole
/// fingerprints (at most 4,096) on a normal scheduler, answering `:dirty`
/// when that could resize a big table; and `$dirty`, the same on a dirty
/// scheduler.
macro_rules! many_nifs {
    ($(#[$doc:meta])* $name:ident, $dirty:ident, $op:expr) => {
        $(#[$doc])*
        #[rustler::nif]
        fn $name<'a>(env: Env<'a>, set: Term<'a>, fps: Vec<u64>) -> NifResult<Term<'a>> {
            many(env, set, fps, $op, false)
        }

        #[rustler::nif(schedule = "DirtyCpu")]
        fn $dirty<'a>(env: Env<'a>, set: Term<'a>, fps: Vec<u64>) -> NifResult<Term<'a>> {
            many(env, set, fps, $op, true)
        }
    };
}

many_nifs!(
    /// `bag_fps_incr/3` over a list of whole fingerprints: `:ok`, or
    /// `:dirty` (then call `bag_fps_incr_many_dirty/2`).
    bag_fps_incr_many,
    bag_fps_incr_many_dirty,
    Op::Incr
);

many_nifs!(
    /// `bag_fps_remove/3` over a list of whole fingerprints: `:ok`, or
    /// `:dirty` (then call `bag_fps_remove_many_dirty/2`).
    bag_fps_remove_many,
    bag_fps_remove_many_dirty,
    Op::Remove
);

/// Empties shard `index` (0-based), before it is rebuilt from the table
/// (freeing a table is one deallocation).
#[rustler::nif]
fn bag_fps_clear(set_term: Term, index: u32) -> NifResult<rustler::Atom> {
    let set = set(set_term)?;
    let index = index as usize;
    if index >= set.shards.len() {
        return Err(rustler::Error::BadArg);
    }
    let mut shard = set.lock(index);
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
    let fps = decode(&bin)?;
    let mut present: Vec<usize> = Vec::new();
    let result = set.batch(&fps, Op::Add, dirty, |i, new| {
        if !new {
            present.push(i);
        }
    });
    Ok(match result {
        Some(()) => present.encode(env),
        None => crate::atoms::dirty().encode(env),
    })
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
    if slots == 0 || slots > MAX_SHARDS {
        return Err(rustler::Error::BadArg);
    }
    let mut used = vec![false; slots as usize];
    for fp in decode(&fps)? {
        used[((fp >> 32) as u32 % slots) as usize] = true;
    }
    Ok((1..=slots)
        .filter(|&slot| used[slot as usize - 1])
        .collect())
}
