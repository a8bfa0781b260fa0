# The hostile terms of every bad-input property test: one PropEr generator,
# and build/2, which turns its small descriptors into the terms they stand for.
defmodule Larder.Test.Hostile do
  @moduledoc false

  # Deep, improper and huge terms are generated as small descriptors
  # ({:"$deep", ...}, {:"$improper", ...}, {:"$huge", ...}) and built by
  # build/2 just before the call: PropEr walks every value it generates and
  # shrinks, which would cost more than the calls themselves on terms of
  # these sizes. So every generated term must go through build/2 before use.

  @typedoc "A PropEr generator."
  @type gen :: :proper_types.type() | term()

  @doc """
  Arbitrary terms, deep ones (up to 100,000 levels), improper lists (up to
  100,000 pairs before the bad tail), huge ones (up to 4 MB binaries,
  200,000-element lists, 100,000-bit integers...), and terms that look like
  match specs, options or conditions. `extra` adds the caller's own
  `{weight, generator}` entries (its placeholders, its option names).
  """
  @spec term([{pos_integer(), gen()}]) :: gen()
  def term(extra \\ []) do
    :proper_types.frequency(
      [
        {6, :proper_types.any()},
        {2, deep()},
        {2, improper()},
        {1, huge()},
        {2, :proper_types.oneof(specials())}
      ] ++ extra
    )
  end

  @doc """
  Option lists for a function whose options are `keys`: mostly proper lists
  of `{key, value}` pairs, each key one of `keys` or `:bogus` (an unknown
  one), each value from `value`; sometimes `term` (a hostile term) instead
  of a list; sometimes such a list with an improper tail.
  """
  @spec options([atom()], gen(), gen()) :: gen()
  def options(keys, value, term) do
    pairs = :proper_types.list({:proper_types.oneof(keys ++ [:bogus]), value})

    :proper_types.frequency([
      {4, pairs},
      {1, term},
      {1, :proper_types.bind(pairs, &(&1 ++ :tail), false)}
    ])
  end

  @doc """
  Handles to call with, as the test's placeholders `{tag, which}`: mostly
  its live structures (`which` is `:live` or `:named`), sometimes one of its
  `bad` ones (dropped, forged, unknown names...), sometimes `term`.
  """
  @spec handle(atom(), [atom()], gen()) :: gen()
  def handle(tag, bad, term) do
    :proper_types.frequency([
      {4, {tag, :proper_types.oneof([:live, :named])}},
      {2, {tag, :proper_types.oneof(bad)}},
      {1, term}
    ])
  end

  @doc """
  The calls that create a structure, each with an option list from `opts`:
  `new/1`, `start_link/1` and `child_spec/1`, as `{fun, args}`.
  """
  @spec creations(gen()) :: [{atom(), [gen()]}]
  def creations(opts), do: [{:new, [opts]}, {:start_link, [opts]}, {:child_spec, [opts]}]

  @doc "Lists, tuples and maps nested up to 100,000 deep (a descriptor)."
  @spec deep() :: gen()
  def deep do
    {:"$deep", :proper_types.integer(1, 100_000),
     :proper_types.oneof([:list, :tuple, :map, :map_key, :improper, :mixed])}
  end

  @doc """
  Improper lists (a descriptor): a short list, then a pair `{key, 1}` and up
  to 100,000 more pairs `{key, i}` before an arbitrary tail.
  """
  @spec improper() :: gen()
  def improper do
    {:"$improper", :proper_types.list(:proper_types.any()), :proper_types.any(),
     :proper_types.integer(0, 100_000), :proper_types.oneof([:k, :a])}
  end

  @doc "Huge terms (a descriptor)."
  @spec huge() :: gen()
  def huge do
    :proper_types.oneof([
      {:"$huge", :binary, :proper_types.integer(1, 4_000_000)},
      {:"$huge", :pairs, :proper_types.integer(1, 200_000)},
      {:"$huge", :keyword, :proper_types.integer(1, 100_000)},
      {:"$huge", :records, :proper_types.integer(1, 100_000)},
      {:"$huge", :atoms, :proper_types.integer(1, 200_000)},
      {:"$huge", :integers, :proper_types.integer(1, 100_000)},
      {:"$huge", :tuple, :proper_types.integer(1, 100_000)},
      {:"$huge", :integer, :proper_types.integer(1, 100_000)}
    ])
  end

  # Terms that look like something: match-spec variables and patterns,
  # options and bounds, conditions, structs, improper lists, funs.
  defp specials do
    [
      %{},
      %{a: 1},
      %{a: %{b: [1 | 2]}},
      %{id: [1 | 2]},
      %{id: 1, a: %{b: [1 | 2]}},
      self(),
      make_ref(),
      fn -> :f end,
      &Enum.map/2,
      :_,
      :and,
      :"$1",
      :"$$",
      :"$_",
      {:_, :"$2"},
      [:_ | :"$3"],
      {:const, :_},
      [{:_, [], [:"$_"]}],
      nil,
      true,
      :infinity,
      -1,
      -0.0,
      2 ** 200,
      "",
      "a\0b",
      <<1::3>>,
      1..3,
      MapSet.new([{:a, 1}]),
      [a: 1],
      [{:a, 1} | :tail],
      {:in, [1 | 2]},
      {:in, :x},
      [a: {:in, [1 | 2]}]
    ]
  end

  @doc """
  Builds the descriptors in a generated term, wherever they sit (in lists,
  improper ones too, tuples and maps). `placeholder` sees every subterm
  first: `{:ok, value}` replaces it (a test's own handles, names, paths),
  `:error` leaves it to build/2. Walks only the generated term, never what
  a descriptor builds.
  """
  @spec build(term(), (term() -> {:ok, term()} | :error)) :: term()
  def build(term, placeholder \\ fn _ -> :error end) do
    case placeholder.(term) do
      {:ok, value} -> value
      :error -> build_term(term, placeholder)
    end
  end

  defp build_term({:"$deep", depth, kind}, _placeholder) when is_integer(depth) do
    Enum.reduce(1..depth, :leaf, fn i, acc ->
      case {kind, rem(i, 3)} do
        {:list, _} -> [acc]
        {:tuple, _} -> {acc}
        {:map, _} -> %{k: acc}
        {:map_key, _} -> %{acc => 1}
        {:improper, _} -> [acc | :tail]
        {:mixed, 0} -> [acc | :tail]
        {:mixed, 1} -> {:k, acc}
        {:mixed, 2} -> %{acc => 1}
      end
    end)
  end

  defp build_term({:"$improper", _list, [], _pairs, key}, _placeholder), do: [{key, 1} | :tail]

  defp build_term({:"$improper", list, tail, pairs, key}, placeholder)
       when is_integer(pairs) do
    tail = build(tail, placeholder)

    build(list, placeholder) ++
      [{key, 1} | Enum.reduce(1..max(pairs, 1), tail, &[{key, &1} | &2])]
  end

  defp build_term({:"$huge", kind, n}, _placeholder) when is_integer(n), do: huge(kind, n)

  defp build_term([head | tail], placeholder),
    do: [build(head, placeholder) | build(tail, placeholder)]

  defp build_term(tuple, placeholder) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.map(&build(&1, placeholder)) |> List.to_tuple()

  defp build_term(map, placeholder) when is_map(map) do
    map
    |> :maps.to_list()
    |> Enum.map(fn {k, v} -> {build(k, placeholder), build(v, placeholder)} end)
    |> :maps.from_list()
  end

  defp build_term(other, _placeholder), do: other

  defp huge(:binary, n), do: :binary.copy(<<7>>, n)
  defp huge(:pairs, n), do: for(i <- 1..n, do: {i, i})
  defp huge(:keyword, n), do: List.duplicate({:k, :v}, n)
  defp huge(:records, n), do: for(i <- 1..n, do: %{id: {:huge, i}, a: i})
  defp huge(:atoms, n), do: List.duplicate(:x, n)
  defp huge(:integers, n), do: Enum.to_list(1..n)
  defp huge(:tuple, n), do: List.to_tuple(Enum.to_list(1..n))
  defp huge(:integer, bits), do: Bitwise.bsl(1, bits)
end
