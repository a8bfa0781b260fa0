defmodule PriceCatalogue.RawFile do
  @moduledoc """
  Reads a whole file in the calling process.

  `File.read/1` asks the file server process, which reads the file and
  keeps a reference to the bytes until its own next garbage collection,
  which an idle file server may never run: for a catalogue (4.5 MB
  compressed) or a service's snapshot (tens of MB) that is memory held for
  nothing. A raw file is read by the caller, so the bytes go with the
  caller's last reference to them.
  """

  @doc """
  The bytes of the file at `path`: `{:ok, binary}` or `{:error, posix}`
  (as `File.read/1`). A file is read to its end, which a file that grows
  while it is read, or one that has no size (in /proc), may have moved.
  """
  @spec read(Path.t()) :: {:ok, binary()} | {:error, File.posix()}
  def read(path) do
    with {:ok, io} <- :file.open(path, [:read, :raw, :binary]) do
      try do
        with {:ok, chunk} <- chunk_size(io), do: read_all(io, chunk, [])
      after
        :file.close(io)
      end
    end
  end

  # The file's size, so that one read takes it all; 64 KB for a file that
  # has no end to seek to (such as those of /proc).
  defp chunk_size(io) do
    case :file.position(io, :eof) do
      {:ok, size} -> with {:ok, 0} <- :file.position(io, :bof), do: {:ok, max(size, 1)}
      {:error, :einval} -> {:ok, 65_536}
      {:error, _} = error -> error
    end
  end

  defp read_all(io, size, acc) do
    case :file.read(io, size) do
      {:ok, data} -> read_all(io, size, [data | acc])
      :eof when acc == [] -> {:ok, ""}
      # One read, as usual: its binary, not a copy.
      :eof when tl(acc) == [] -> {:ok, hd(acc)}
      :eof -> {:ok, acc |> :lists.reverse() |> IO.iodata_to_binary()}
      {:error, _} = error -> error
    end
  end
end
