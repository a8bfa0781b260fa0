defmodule Larder.Postgres.SCRAMTest do
  use ExUnit.Case, async: true

  alias Larder.Postgres.SCRAM

  # RFC 7677, section 3: user "user", password "pencil".
  @client_nonce "rOprNGfwEbeRWgbNEkqO"
  @server_first "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0," <>
                  "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
  @client_final "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0," <>
                  "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
  @server_final "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

  test "RFC 7677's exchange: the client's proof and the server's signature" do
    {first, state} = SCRAM.client_first(@client_nonce, "user")
    assert first == "n,,n=user,r=" <> @client_nonce
    assert {:ok, @client_final, state} = SCRAM.client_final(state, "pencil", @server_first)
    assert SCRAM.verify_server_final(state, @server_final) == :ok
  end

  test "a server signature made without the password is refused" do
    {_first, state} = SCRAM.client_first(@client_nonce, "user")
    {:ok, _final, state} = SCRAM.client_final(state, "pencil", @server_first)
    forged = "v=" <> Base.encode64(:binary.copy(<<0>>, 32))
    assert {:error, message} = SCRAM.verify_server_final(state, forged)
    assert message =~ "does not know the password"
    assert {:error, _} = SCRAM.verify_server_final(state, "v=notbase64!")
    assert {:error, message} = SCRAM.verify_server_final(state, "e=invalid-proof")
    assert message =~ "invalid-proof"
  end

  test "a server-first-message of the wrong shape is an error, not a raise" do
    {_first, state} = SCRAM.client_first(@client_nonce, "user")

    for message <- [
          "",
          "garbage",
          # the nonce does not extend the client's
          "r=someoneelse,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
          # the same nonce, not extended
          "r=#{@client_nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
          "r=#{@client_nonce}x,s=***,i=4096",
          "r=#{@client_nonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=0",
          "r=#{@client_nonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=-5",
          "r=#{@client_nonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096x",
          # an iteration count that would keep the client hashing for minutes
          "r=#{@client_nonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=2147483647",
          "r=#{@client_nonce}x,i=4096",
          <<0, 255, 1>>
        ] do
      assert {:error, text} = SCRAM.client_final(state, "pencil", message)
      assert is_binary(text)
    end
  end

  test "a final message before the exchange is refused" do
    {_first, state} = SCRAM.client_first()
    assert {:error, _} = SCRAM.verify_server_final(state, @server_final)
  end

  test "passwords are prepared as Postgres prepares them" do
    # pure ASCII as it is, controls included
    assert SCRAM.prepare("pencil") == "pencil"
    assert SCRAM.prepare("a\tb") == "a\tb"
    # a non-ASCII space becomes a space; a soft hyphen is mapped to nothing
    assert SCRAM.prepare("a\u00A0b\u00ADc") == "a bc"
    # NFKC: the "fi" ligature and a full-width letter
    assert SCRAM.prepare("\uFB01\uFF21") == "fiA"
    # not UTF-8, or prohibited characters: the raw bytes
    assert SCRAM.prepare(<<0xFF, 0xFE>>) == <<0xFF, 0xFE>>
    assert SCRAM.prepare("é\u0007") == "é\u0007"
  end
end
