# Sentinel discovery for Larder's Redis client: the :sentinel option's
# check, finding the master (SENTINEL get-master-addr-by-name, then the
# node's own ROLE), and what the messages a topology hears on every
# sentinel (+switch-master and the events that say a failover is under
# way) say.
# Everything a sentinel or a node says is untrusted: checked, bounded, and
# a bad answer is an answer from nobody.
defmodule Larder.Redis.Sentinel do
  @moduledoc false

  alias Larder.Redis.Socket

  # The most sentinels one topology asks, and the largest reply read from one.
  @max_sentinels 16
  @max_reply_bytes 65_536

  # The events a sentinel publishes once a failover of a master is under
  # way, all before the promoted replica can be named as the master: by
  # any sentinel that starts one (+try-failover), then by the one elected
  # to lead it, which sends the replica REPLICAOF NO ONE one of its timer
  # ticks after +failover-state-send-slaveof-noone. Not +sdown or +odown:
  # a master down for some sentinels, or all, may come back with no
  # failover.
  @failover_channels ~w(+try-failover +elected-leader +failover-state-select-slave
                        +selected-slave +failover-state-send-slaveof-noone
                        +failover-state-wait-promotion +promoted-slave
                        +failover-state-reconf-slaves)

  # Of those, the ones that say the replica is being promoted, or was: the
  # leader publishes the first one tick before it sends REPLICAOF NO ONE.
  # From then on, what the old master acknowledges is lost.
  @promotion_channels ~w(+failover-state-send-slaveof-noone +failover-state-wait-promotion
                         +promoted-slave +failover-state-reconf-slaves)

  # A failover given up: the master in use stays the master.
  @abort_channels ~w(-failover-abort-not-elected -failover-abort-no-good-slave
                     -failover-abort-slave-timeout)

  @doc """
  Checks the :sentinel option of `what` (the module whose option it is);
  raises ArgumentError naming what is wrong.
  """
  def validate!(nil, _what), do: nil

  def validate!(opts, what) when is_list(opts) do
    opts =
      Larder.Options.validate!(
        opts,
        [
          sentinels:
            {{:custom, "a list of 1 to #{@max_sentinels} {host, port} tuples", &sentinels?/1},
             :required},
          master: {{:string, 1, 255}, :required},
          username: {{:or_nil, {:custom, "a string", &is_binary/1}}, nil},
          password: {{:or_nil, {:custom, "a string", &is_binary/1}}, nil}
        ],
        "#{what} :sentinel"
      )

    opts
  end

  def validate!(other, what) do
    raise ArgumentError,
          "expected #{what} option :sentinel to be a keyword list, got: " <>
            inspect(other, limit: 10)
  end

  defp sentinels?(list) when is_list(list) and list != [] and length(list) <= @max_sentinels,
    do: Enum.all?(list, &address?/1)

  defp sentinels?(_), do: false

  defp address?({host, port}),
    do: is_binary(host) and byte_size(host) in 1..255 and is_integer(port) and port in 1..65_535

  defp address?(_), do: false

  @doc """
  The master the sentinels name, checked with its own `ROLE`:
  `{:ok, {host, port}}` or `{:error, {where, reason}}`, where is the
  server that failed (`"sentinel 127.0.0.1:26379"`, or `"master ..."` for
  the address a sentinel named) and reason what went wrong there (see
  describe/1). Sentinels are asked in turn (each within `timeout`); the
  first whose master says it is one wins. `auth` is the data nodes' AUTH
  command (`[]` for none).
  """
  @spec master(keyword(), [[binary()]], pos_integer()) ::
          {:ok, {binary(), 1..65_535}} | {:error, {binary(), term()}}
  def master(sentinel, auth, timeout) do
    Enum.reduce_while(sentinel[:sentinels], {:error, {"no sentinel", :none}}, fn {host, port},
                                                                                 _acc ->
      command = ["SENTINEL", "get-master-addr-by-name", sentinel[:master]]
      where = "sentinel " <> Socket.address(host, port)

      with {:ok, reply} <- request(host, port, auth(sentinel), command, timeout),
           {:ok, addr} <- parse_addr(reply),
           :ok <- check_role(addr, auth, timeout) do
        {:halt, {:ok, addr}}
      else
        {:error, {"master " <> _, _reason} = error} -> {:cont, {:error, error}}
        {:error, reason} -> {:cont, {:error, {where, reason}}}
      end
    end)
  end

  @doc "An error of master/3 in words, for a log line."
  @spec describe({binary(), term()}) :: binary()
  def describe({where, :unknown_master}), do: "#{where} knows no such master"
  def describe({where, :bad_master_address}), do: "#{where} named no valid address"
  def describe({where, {:not_master, role}}), do: "#{where} says it is a #{role}, not a master"
  def describe({where, :bad_role_reply}), do: "#{where} answered ROLE with no role"

  def describe({where, {:error_reply, text}}),
    do: "#{where} replied with an error: #{binary_part(text, 0, min(byte_size(text), 200))}"

  def describe({where, reason}), do: "#{where}: #{Socket.describe(reason)}"

  defp parse_addr([host, port]) when is_binary(host) and is_binary(port) do
    case Integer.parse(port) do
      {n, ""} when n in 1..65_535 and byte_size(host) in 1..255 -> {:ok, {host, n}}
      _ -> {:error, :bad_master_address}
    end
  end

  defp parse_addr(:undefined), do: {:error, :unknown_master}
  defp parse_addr(_), do: {:error, :bad_master_address}

  defp check_role({host, port}, auth, timeout) do
    where = "master " <> Socket.address(host, port)

    case request(host, port, auth, ["ROLE"], timeout) do
      {:ok, ["master" | _]} -> :ok
      {:ok, [role | _]} when is_binary(role) -> {:error, {where, {:not_master, role}}}
      {:ok, _} -> {:error, {where, :bad_role_reply}}
      {:error, reason} -> {:error, {where, reason}}
    end
  end

  @doc "A sentinel's AUTH (with the :sentinel option's password only): the handshake's commands."
  @spec auth(keyword()) :: [[binary()]]
  def auth(sentinel) do
    if sentinel[:password],
      do: Socket.handshake(username: sentinel[:username], password: sentinel[:password]),
      else: []
  end

  @doc """
  The channels a sentinel publishes the events of a failover on, which a
  topology subscribes to on every sentinel: `+switch-master`, the events
  that say a failover is under way, and those that say it was given up.
  """
  @spec channels() :: [binary()]
  def channels, do: ["+switch-master" | @failover_channels] ++ @abort_channels

  @doc "The largest reply read from a sentinel."
  @spec max_reply_bytes() :: pos_integer()
  def max_reply_bytes, do: @max_reply_bytes

  @doc """
  What a message a sentinel published on `channel` says (untrusted: the
  payload may be anything): `{:switch, master_name}` for `+switch-master`
  (the addresses in it are not used: the master is asked again);
  `{:failover, master_name}` for a failover event, followed by
  `{:promoting, master_name, {host, port} | nil}` (the address of the
  master being replaced) for one that says the replica is being promoted;
  `{:aborted, master_name}` for a `-failover-abort-*`; `:bad` for a
  failover or abort event whose payload names no master; nothing for
  anything else.
  """
  @spec event(term(), term()) :: [tuple() | :bad]
  def event("+switch-master", payload) when is_binary(payload) do
    [name | _] = String.split(payload, " ", parts: 2)
    [{:switch, name}]
  end

  def event(channel, payload) when channel in @failover_channels do
    case master_named(payload) do
      nil ->
        [:bad]

      {name, address} when channel in @promotion_channels ->
        [{:failover, name}, {:promoting, name, address}]

      {name, _address} ->
        [{:failover, name}]
    end
  end

  def event(channel, payload) when channel in @abort_channels do
    case master_named(payload) do
      nil -> [:bad]
      {name, _address} -> [{:aborted, name}]
    end
  end

  def event(_channel, _payload), do: []

  # The master an event names, and its address ({host, port}, or nil when
  # the payload does not give one): "master <name> <ip> <port>" or, for
  # the replica being promoted, "slave <ip:port> <ip> <port> @ <master
  # name> <ip> <port>".
  defp master_named(payload) do
    case is_binary(payload) && String.split(payload, " ", parts: 7) do
      ["master", name | rest] -> {name, address(rest)}
      ["slave", _, _, _, "@", name, rest] -> {name, address(String.split(rest, " "))}
      ["slave", _, _, _, "@", name] -> {name, nil}
      _ -> nil
    end
  end

  defp address([host, port | _]) do
    case parse_addr([host, port]) do
      {:ok, addr} -> addr
      _ -> nil
    end
  end

  defp address(_), do: nil

  # One command on a fresh connection (its handshake `auth`): its value,
  # or {:error, reason}. An error reply is an error.
  defp request(host, port, auth, command, timeout) do
    opts = [timeout: timeout, handshake: auth, max_reply_bytes: @max_reply_bytes]

    case Socket.request(host, port, [command], opts) do
      {:ok, [{:ok, value}]} -> {:ok, value}
      {:ok, [{:error, message}]} -> {:error, {:error_reply, message}}
      {:error, _} = error -> error
    end
  end
end
