# A Larder.Table snapshot file taken apart into its chunks and framed again
# with valid lengths, checksums and trailer, as a forger would write it
# (see Larder.Table.Snapshot for the layout).
defmodule Larder.Test.TableSnapshotFile do
  @moduledoc false

  @doc """
  The chunks `{kind, count, payload}` of a file's bytes after its
  `"LARDERTAB"` and version byte, up to the trailer.
  """
  def parse(<<0, _::binary-size(24)>>), do: []

  def parse(<<kind, size::32, n::32, _::32, p::binary-size(size), rest::binary>>),
    do: [{kind, n, p} | parse(rest)]

  @doc "`chunks` (as `parse/1` gives them) framed as a file of format `version`."
  def frame(chunks, version \\ 2) do
    {r, k, t} = Enum.reduce(chunks, {0, 0, 0}, &count/2)

    ["LARDERTAB", version]
    |> Kernel.++(
      for {kind, n, p} <- chunks,
          do: [<<kind, byte_size(p)::32, n::32, :erlang.crc32(p)::32>>, p]
    )
    |> Kernel.++([<<0, r::64, k::64, t::64>>])
    |> IO.iodata_to_binary()
  end

  defp count({2, n, _}, {r, k, t}), do: {r + n, k, t}
  defp count({3, n, _}, {r, k, t}), do: {r, k + n, t}
  defp count({4, n, _}, {r, k, t}), do: {r, k, t + n}
  defp count(_, acc), do: acc
end
