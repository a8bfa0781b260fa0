# The client side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres uses
# it: builds the client's two messages and checks the server's, including
# its signature, which proves that the server knows the password.
defmodule Larder.Postgres.SCRAM do
  @moduledoc false

  # Contract (internal).
  #
  # client_first/0 -> {message, state}; client_final(state, password,
  # server_first) -> {:ok, message, state} | {:error, reason};
  # verify_server_final(state, server_final) -> :ok | {:error, reason}.
  #
  # No channel binding (the gs2 header "n,,": the client does not support
  # it, which a Postgres server accepts with or without TLS). The user
  # name is left empty: Postgres takes the startup message's.
  #
  # The server's first message is untrusted: its nonce must extend the
  # client's, its salt be base64, its iteration count an integer in
  # 1..@max_iterations (a hostile server cannot make the client hash for
  # minutes: 4,096 is Postgres's default and `scram_iterations` rarely
  # goes far beyond). A server-final-message is accepted only with the
  # signature computed from the same password, salt and messages,
  # compared in constant time.
  #
  # The password is prepared as SASLprep (RFC 4013) would, as far as
  # Postgres's own use of it goes: a pure-ASCII password is used as it is;
  # otherwise non-ASCII spaces become spaces, the
  # characters "commonly mapped to nothing" are dropped, the result is
  # NFKC-normalized; a password that is not UTF-8 or holds a prohibited
  # character (controls, private use, surrogates, non-characters) is used
  # as its raw bytes, which is what Postgres does when it stores one.

  @max_iterations 1_000_000

  @enforce_keys [:nonce, :client_first_bare]
  defstruct [:nonce, :client_first_bare, :server_signature]

  @doc "The largest iteration count accepted from a server."
  def max_iterations, do: @max_iterations

  @doc """
  The client-first-message and the state to continue with: a random
  nonce and an empty user name, unless given (RFC 7677's test vector
  gives both).
  """
  @spec client_first(binary() | nil, binary()) :: {binary(), %__MODULE__{}}
  def client_first(nonce \\ nil, username \\ "") do
    nonce = nonce || Base.encode64(:crypto.strong_rand_bytes(18))
    bare = "n=" <> username <> ",r=" <> nonce
    {"n,," <> bare, %__MODULE__{nonce: nonce, client_first_bare: bare}}
  end

  @doc """
  The client-final-message for the server-first-message `server_first`,
  or `{:error, reason}` when that message is not a valid one.
  """
  @spec client_final(%__MODULE__{}, binary(), binary()) ::
          {:ok, binary(), %__MODULE__{}} | {:error, String.t()}
  def client_final(%__MODULE__{} = state, password, server_first) when is_binary(server_first) do
    with {:ok, attrs} <- attributes(server_first),
         {:ok, nonce} <- fetch(attrs, "r"),
         :ok <- check_nonce(nonce, state.nonce),
         {:ok, salt64} <- fetch(attrs, "s"),
         {:ok, salt} <- decode64(salt64, "salt"),
         {:ok, iterations} <- fetch(attrs, "i"),
         {:ok, iterations} <- iterations(iterations) do
      final_bare = "c=biws,r=" <> nonce
      auth_message = Enum.join([state.client_first_bare, server_first, final_bare], ",")
      salted = :crypto.pbkdf2_hmac(:sha256, prepare(password), salt, iterations, 32)
      client_key = hmac(salted, "Client Key")
      stored_key = :crypto.hash(:sha256, client_key)
      proof = :crypto.exor(client_key, hmac(stored_key, auth_message))
      server_signature = hmac(hmac(salted, "Server Key"), auth_message)

      {:ok, final_bare <> ",p=" <> Base.encode64(proof),
       %{state | server_signature: server_signature}}
    end
  end

  @doc "Checks the server-final-message: `:ok` only with the expected signature."
  @spec verify_server_final(%__MODULE__{}, binary()) :: :ok | {:error, String.t()}
  def verify_server_final(%__MODULE__{server_signature: expected}, server_final)
      when is_binary(expected) and is_binary(server_final) do
    with {:ok, attrs} <- attributes(server_final),
         :ok <- server_error(attrs),
         {:ok, signature64} <- fetch(attrs, "v"),
         {:ok, signature} <- decode64(signature64, "signature"),
         true <- byte_size(signature) == 32 and :crypto.hash_equals(signature, expected) do
      :ok
    else
      false -> {:error, "the server's SCRAM signature is wrong: it does not know the password"}
      {:error, _} = error -> error
    end
  end

  def verify_server_final(%__MODULE__{}, _server_final),
    do: {:error, "a SCRAM final message came before the exchange"}

  defp server_error(attrs) do
    case List.keyfind(attrs, "e", 0) do
      nil -> :ok
      {"e", error} -> {:error, "the server ended SCRAM with error " <> inspect(error)}
    end
  end

  # "k=v,k=v": one-letter keys; a value may hold "=" (base64) but not ",".
  defp attributes(message) do
    message
    |> :binary.split(",", [:global])
    |> Enum.reduce_while({:ok, []}, fn
      <<key, ?=, value::binary>>, {:ok, acc} when key in ?a..?z or key in ?A..?Z ->
        {:cont, {:ok, [{<<key>>, value} | acc]}}

      _, _ ->
        {:halt, {:error, "a SCRAM message of the wrong shape"}}
    end)
    |> case do
      {:ok, attrs} -> {:ok, Enum.reverse(attrs)}
      error -> error
    end
  end

  defp fetch(attrs, key) do
    case List.keyfind(attrs, key, 0) do
      {^key, value} -> {:ok, value}
      nil -> {:error, "a SCRAM message without its #{key}= attribute"}
    end
  end

  defp check_nonce(nonce, client_nonce) do
    if byte_size(nonce) > byte_size(client_nonce) and
         binary_part(nonce, 0, byte_size(client_nonce)) == client_nonce and
         printable?(nonce),
       do: :ok,
       else: {:error, "the server's SCRAM nonce does not extend the client's"}
  end

  defp printable?(nonce), do: for(<<c <- nonce>>, c < 0x21 or c > 0x7E, do: c) == []

  defp decode64(text, what) do
    case Base.decode64(text) do
      {:ok, value} when value != "" -> {:ok, value}
      _ -> {:error, "the server's SCRAM #{what} is not base64"}
    end
  end

  defp iterations(text) do
    case Integer.parse(text) do
      {n, ""} when n >= 1 and n <= @max_iterations ->
        {:ok, n}

      _ ->
        {:error,
         "the server's SCRAM iteration count is not an integer in 1..#{@max_iterations}: " <>
           inspect(text, limit: 40, printable_limit: 40)}
    end
  end

  defp hmac(key, data), do: :crypto.mac(:hmac, :sha256, key, data)

  ## SASLprep, as far as Postgres goes

  # RFC 3454 C.1.2: non-ASCII space characters (mapped to SPACE).
  @spaces [0x00A0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006] ++
            [0x2007, 0x2008, 0x2009, 0x200A, 0x200B, 0x202F, 0x205F, 0x3000]

  # RFC 3454 B.1: commonly mapped to nothing.
  @nothing [0x00AD, 0x034F, 0x1806, 0x180B, 0x180C, 0x180D, 0x200B, 0x200C, 0x200D] ++
             [0x2060, 0xFE00, 0xFE01, 0xFE02, 0xFE03, 0xFE04, 0xFE05, 0xFE06, 0xFE07] ++
             [0xFE08, 0xFE09, 0xFE0A, 0xFE0B, 0xFE0C, 0xFE0D, 0xFE0E, 0xFE0F, 0xFEFF]

  @doc false
  # The password as Postgres hashes it (see the contract above).
  @spec prepare(binary()) :: binary()
  def prepare(password) do
    if ascii?(password) do
      password
    else
      with true <- String.valid?(password),
           mapped =
             for(<<c::utf8 <- password>>, c not in @nothing, do: if(c in @spaces, do: 32, else: c)),
           normalized when is_binary(normalized) <-
             :unicode.characters_to_nfkc_binary(List.to_string(mapped)),
           true <- normalized != "" and allowed?(normalized) do
        normalized
      else
        _ -> password
      end
    end
  end

  # Postgres takes a pure-ASCII password as it is (controls included).
  defp ascii?(password), do: for(<<c <- password>>, c > 0x7F, do: c) == []

  defp allowed?(text) do
    text
    |> String.to_charlist()
    |> Enum.all?(fn c ->
      not (c < 0x20 or c in 0x7F..0x9F or c in 0xE000..0xF8FF or c in 0xF0000..0x10FFFF or
             c in 0xFDD0..0xFDEF or rem(c, 0x10000) in [0xFFFE, 0xFFFF] or
             c in 0x2028..0x202E or c in 0x206A..0x206F)
    end)
  end
end
