[
  inputs: [
    "{mix,.formatter}.exs",
    "mix/**/*.exs",
    "{config,lib,test,bench,examples}/**/*.{ex,exs}"
  ]
]
