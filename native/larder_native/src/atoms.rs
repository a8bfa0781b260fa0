//! Atoms shared by the NIF functions.

rustler::atoms! {
    ok,
    add,
    remove,
    add_terms,
    remove_terms,
    set_terms,
    no_reverse,
    and,
    or,
    not,
    term,
    dirty,
    bad_expr,
    bad_op,
    bad_ids,
    bad_index,
    dropped,
    too_deep,
    internal,
    bad_snapshot,
}
