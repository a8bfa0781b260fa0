# Redis Cluster key routing: CRC16 slots with hash tags, the slot map built
# from an untrusted CLUSTER SLOTS reply, and untrusted redirect errors.
defmodule Larder.Redis.Cluster do
  @moduledoc false

  # Contract (internal).
  #
  # Complexity: `slot/1` is O(key size) (one table step per byte, plus a
  # `:binary.match` for the hash tag); `master/2` is O(1) (`elem/2` on a
  # 16,384-tuple); `slot_map/2` is O(slots + reply size).
  #
  # Concurrency: pure functions over immutable terms. A slot map is one
  # term; whoever holds the topology publishes a new one whole (in its state
  # or in `:persistent_term`: do not put the map in ETS, whose lookup would
  # copy the 16,384-tuple on every call).
  #
  # Failures: replies and errors come from the network and are untrusted.
  # `slot_map/2` never raises on a reply: entries that are not what
  # CLUSTER SLOTS sends are skipped and counted in `:bad`; a reply that is
  # not a list at all, or whose ranges name more than @max_masters masters,
  # is `{:error, :not_a_list}` or `{:error, {:too_many_masters, n}}`.
  # `redirect/2` returns `:other` for anything that is not a well-formed
  # MOVED, ASK, TRYAGAIN or CLUSTERDOWN error.
  #
  # Performance: `slot/1` is O(key bytes), one table lookup per byte;
  # `master/2` is two tuple reads. Both run on every L2 call of a cluster
  # cache.

  import Bitwise

  @slots 16_384
  @max_host 255
  # Entries beyond this many in one reply are not read (the spec's maximum
  # is one per slot).
  @max_entries @slots
  # The most masters a map may name: Redis Cluster is designed for up to
  # 1,000 nodes. Each master costs the topology a pool of connections (and
  # their reconnects while it is down): a reply naming more is refused.
  @max_masters 1_000

  @typedoc "A node's address."
  @type address :: {host :: binary(), port :: 1..65_535}

  @typedoc """
  The slot map: `slots` is a 16,384-tuple of indexes into `masters` (nil
  for a slot no node serves); `bad` counts the reply's skipped entries.
  """
  @type slot_map :: %{slots: tuple(), masters: tuple(), bad: non_neg_integer()}

  @typedoc "A parsed error reply."
  @type redirect ::
          {:moved, 0..16_383, address()}
          | {:ask, 0..16_383, address()}
          | :tryagain
          | :clusterdown
          | :other

  crc_table =
    for byte <- 0..255 do
      Enum.reduce(1..8, byte <<< 8, fn _, crc ->
        if (crc &&& 0x8000) != 0,
          do: bxor(crc <<< 1, 0x1021) &&& 0xFFFF,
          else: crc <<< 1 &&& 0xFFFF
      end)
    end

  @crc_table List.to_tuple(crc_table)

  @doc "The most masters a slot map may name."
  @spec max_masters() :: pos_integer()
  def max_masters, do: @max_masters

  @doc "Number of hash slots in a Redis Cluster."
  @spec slots() :: pos_integer()
  def slots, do: @slots

  @doc "CRC16 (XMODEM: poly 0x1021, init 0), as Redis Cluster computes it."
  @spec crc16(binary()) :: 0..0xFFFF
  def crc16(data) when is_binary(data), do: crc16(data, 0)

  defp crc16(<<byte, rest::binary>>, crc) do
    index = bxor(crc >>> 8, byte) &&& 0xFF
    crc16(rest, bxor(crc <<< 8 &&& 0xFFFF, elem(@crc_table, index)))
  end

  defp crc16(<<>>, crc), do: crc

  @doc """
  The key's hash slot: CRC16 mod 16384 of the hash tag (the bytes between
  the first `{` and the next `}`, when there are any), else of the key.
  """
  @spec slot(binary()) :: 0..16_383
  def slot(key) when is_binary(key), do: crc16(hash_part(key)) &&& @slots - 1

  # The bytes between the first { and the next }, when there are any, else
  # the key. A byte scan: :binary.match/2 with an uncompiled pattern costs
  # more than the whole CRC of a short key.
  defp hash_part(key), do: find_open(key, key)

  defp find_open(<<?{, rest::binary>>, key), do: find_close(rest, 0, rest, key)
  defp find_open(<<_, rest::binary>>, key), do: find_open(rest, key)
  defp find_open(<<>>, key), do: key

  defp find_close(<<?}, _::binary>>, n, tag, _key) when n > 0, do: binary_part(tag, 0, n)
  defp find_close(<<?}, _::binary>>, 0, _tag, key), do: key
  defp find_close(<<_, rest::binary>>, n, tag, key), do: find_close(rest, n + 1, tag, key)
  defp find_close(<<>>, _n, _tag, key), do: key

  @doc """
  `"{tag}:name"`, where tag is `prefix` (or, when `prefix` is empty or
  holds a `}`, a digest of it): the keys and channels one cache names this
  way share one slot, so they live on one master (e.g. its generation key
  and its sharded invalidation channel).
  """
  @spec tagged(binary(), binary()) :: binary()
  def tagged(prefix, name) when is_binary(prefix) and is_binary(name) do
    tag =
      if prefix == "" or String.contains?(prefix, "}"),
        do: "larder:" <> Base.encode16(:crypto.hash(:sha256, prefix), case: :lower),
        else: prefix

    "{" <> tag <> "}:" <> name
  end

  @doc """
  Builds the slot map from a `CLUSTER SLOTS` reply (as
  Larder.Redis.RESP returns it: integers come as decimal binaries). An empty host means the node the
  command was sent to, `default_host`. Only masters are kept; a reply
  whose usable ranges name more than `max_masters/0` masters is refused.
  """
  @spec slot_map(term(), binary()) ::
          {:ok, slot_map()} | {:error, :not_a_list | {:too_many_masters, pos_integer()}}
  def slot_map(reply, default_host) when is_list(reply) and is_binary(default_host) do
    {ranges, bad} = ranges(reply, default_host, @max_entries, [], 0)
    {ranges, overlapping} = disjoint(Enum.sort(ranges))
    masters = ranges |> Enum.map(&elem(&1, 2)) |> Enum.uniq()

    case length(masters) do
      n when n > @max_masters ->
        {:error, {:too_many_masters, n}}

      _ ->
        index = masters |> Enum.with_index() |> Map.new()

        slots =
          ranges
          |> Enum.map(fn {first, last, address} -> {first, last, Map.fetch!(index, address)} end)
          |> fill(0, [])
          |> List.to_tuple()

        {:ok, %{slots: slots, masters: List.to_tuple(masters), bad: bad + overlapping}}
    end
  end

  def slot_map(_reply, default_host) when is_binary(default_host), do: {:error, :not_a_list}

  defp ranges([entry | rest], host, budget, acc, bad) when budget > 0 do
    case range(entry, host) do
      {:ok, range} -> ranges(rest, host, budget - 1, [range | acc], bad)
      :error -> ranges(rest, host, budget - 1, acc, bad + 1)
    end
  end

  defp ranges([_ | _], _host, 0, acc, bad), do: {Enum.reverse(acc), bad + 1}
  defp ranges(_end_or_improper, _host, _budget, acc, bad), do: {Enum.reverse(acc), bad}

  defp range([first, last, [host, port | _] | _], default_host) do
    with {:ok, first} <- integer(first, 0, @slots - 1),
         {:ok, last} <- integer(last, first, @slots - 1),
         {:ok, host} <- host(host, default_host),
         {:ok, port} <- integer(port, 1, 65_535) do
      {:ok, {first, last, {host, port}}}
    else
      _ -> :error
    end
  end

  defp range(_entry, _default_host), do: :error

  # Sorted ranges without those that overlap an earlier one (counted): a
  # reply's ranges are disjoint, and this keeps the work O(slots).
  defp disjoint(sorted), do: disjoint(sorted, -1, [], 0)

  defp disjoint([{first, last, _} = range | rest], end_, acc, bad) when first > end_,
    do: disjoint(rest, last, [range | acc], bad)

  defp disjoint([_ | rest], end_, acc, bad), do: disjoint(rest, end_, acc, bad + 1)
  defp disjoint([], _end, acc, bad), do: {Enum.reverse(acc), bad}

  # The 16,384 entries, slot by slot: nil in the gaps.
  defp fill([{first, last, i} | rest], next, acc) do
    acc = List.duplicate(i, last - first + 1) ++ List.duplicate(nil, first - next) ++ acc
    fill(rest, last + 1, acc)
  end

  defp fill([], next, acc), do: Enum.reverse(List.duplicate(nil, @slots - next) ++ acc)

  @doc "The master that serves `slot`, or nil when no node does."
  @spec master(slot_map(), 0..16_383) :: address() | nil
  def master(%{slots: slots, masters: masters}, slot) do
    case elem(slots, slot) do
      nil -> nil
      i -> elem(masters, i)
    end
  end

  @doc "The masters of the map, each once."
  @spec masters(slot_map()) :: [address()]
  def masters(%{masters: masters}), do: Tuple.to_list(masters)

  @doc """
  Parses an error reply's text: `MOVED <slot> <host>:<port>`, `ASK <slot>
  <host>:<port>`, `TRYAGAIN ...`, `CLUSTERDOWN ...`; anything else, or a
  redirect that is malformed, is `:other`. An empty host means
  `default_host`.
  """
  @spec redirect(term(), binary()) :: redirect()
  def redirect("MOVED " <> rest, default_host), do: redirect(:moved, rest, default_host)
  def redirect("ASK " <> rest, default_host), do: redirect(:ask, rest, default_host)
  def redirect("TRYAGAIN" <> _, _default_host), do: :tryagain
  def redirect("CLUSTERDOWN" <> _, _default_host), do: :clusterdown
  def redirect(_error, _default_host), do: :other

  defp redirect(kind, rest, default_host) when byte_size(rest) <= @max_host + 32 do
    with [slot, endpoint] <- String.split(rest, " "),
         {:ok, slot} <- integer(slot, 0, @slots - 1),
         {:ok, host, port} <- endpoint(endpoint),
         {:ok, host} <- host(host, default_host),
         {:ok, port} <- integer(port, 1, 65_535) do
      {kind, slot, {host, port}}
    else
      _ -> :other
    end
  end

  defp redirect(_kind, _rest, _default_host), do: :other

  # host:port, split at the last colon (an IPv6 host holds colons).
  defp endpoint(endpoint) do
    case :binary.matches(endpoint, ":") do
      [] ->
        :error

      matches ->
        {at, 1} = List.last(matches)

        {:ok, binary_part(endpoint, 0, at),
         binary_part(endpoint, at + 1, byte_size(endpoint) - at - 1)}
    end
  end

  defp host("", default_host), do: {:ok, default_host}

  defp host(host, _default_host) when is_binary(host) and byte_size(host) <= @max_host do
    if host_chars?(host), do: {:ok, host}, else: :error
  end

  defp host(_host, _default_host), do: :error

  defp host_chars?(<<c, rest::binary>>) when c >= 0x21 and c <= 0x7E and c != ?? do
    host_chars?(rest)
  end

  defp host_chars?(<<>>), do: true
  defp host_chars?(_), do: false

  defp integer(value, min, max) when is_integer(value) and value >= min and value <= max,
    do: {:ok, value}

  defp integer(value, min, max) when is_binary(value) and byte_size(value) in 1..5 do
    if digits?(value), do: integer(String.to_integer(value), min, max), else: :error
  end

  defp integer(_value, _min, _max), do: :error

  defp digits?(<<c, rest::binary>>) when c in ?0..?9, do: digits?(rest)
  defp digits?(<<>>), do: true
  defp digits?(_), do: false
end
