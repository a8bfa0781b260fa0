# The Larder.Register workloads shared by bench/register_bench.exs and the
# demo, compiled (closures in a script would be interpreted).
defmodule Larder.RegisterBench.Work do
  @moduledoc false

  alias Larder.Register

  # One contender: how it reads and writes a key.
  def contender(:ets, tab),
    do: {fn k -> ets_get(tab, k) end, fn k, v -> :ets.insert(tab, {k, v}) end}

  def contender(:plain, tab) do
    plain = Larder.RegisterBench.Plain
    {fn k -> plain.get(tab, k) end, &plain.put(tab, &1, &2)}
  end

  def contender(:register, reg),
    do: {fn k -> Register.get(reg, k) end, &Register.put(reg, &1, &2)}

  def contender(:persistent_term) do
    {fn k -> :persistent_term.get(k) end, fn k, v -> :persistent_term.put(k, v) end}
  end

  defp ets_get(tab, key) do
    case :ets.lookup(tab, key) do
      [{_, value}] -> value
      [] -> nil
    end
  end

  # Runner `r` does `ops` operations; operation i touches key rem(i + r, n)
  # and is a put when rem(i + r, every) == 0, so runners write at different
  # moments.
  def mix({get, put}, keys, every, value, ops, r) do
    mix_loop(get, put, keys, tuple_size(keys), every, value, ops, r, 0)
  end

  defp mix_loop(_get, _put, _keys, _n, _every, _value, ops, _r, ops), do: :ok

  defp mix_loop(get, put, keys, n, every, value, ops, r, i) do
    key = elem(keys, rem(i + r, n))

    if rem(i + r, every) == 0 do
      put.(key, [i | value])
    else
      get.(key)
    end

    mix_loop(get, put, keys, n, every, value, ops, r, i + 1)
  end

  def reread({get, _put}, key, ops), do: reread_loop(get, key, ops)

  # One read, for `each:` timing: the closure is made here because one
  # written at the top level of a script is interpreted (microseconds a call).
  def read_once({get, _put}, key), do: fn -> get.(key) end

  defp reread_loop(_get, _key, 0), do: :ok

  defp reread_loop(get, key, n) do
    get.(key)
    reread_loop(get, key, n - 1)
  end

  # Heap cost of re-reading an unchanged value in a fresh process with a
  # fixed 10k-word young heap: minor GCs during `n` reads (0 means nothing was
  # allocated that did not fit in that heap) and the growth of the total heap.
  def heap_cost(contender, key, n) do
    parent = self()

    :erlang.spawn_opt(
      fn ->
        {get, _} = contender
        get.(key)
        :erlang.garbage_collect()
        gcs0 = minor_gcs()
        {:total_heap_size, heap0} = :erlang.process_info(self(), :total_heap_size)
        reread(contender, key, n)
        {:total_heap_size, heap1} = :erlang.process_info(self(), :total_heap_size)
        send(parent, {:heap_cost, minor_gcs() - gcs0, heap1 - heap0})
      end,
      min_heap_size: 10_000
    )

    receive do
      {:heap_cost, gcs, growth} -> {gcs, growth}
    end
  end

  defp minor_gcs do
    {:garbage_collection, info} = :erlang.process_info(self(), :garbage_collection)
    Keyword.fetch!(info, :minor_gcs)
  end
end
