[
  inputs: [
    "{mix,.formatter}.exs",
    "mix/**/*.exs",
    "{config,lib,test,bench,examples,support}/**/*.{ex,exs}"
  ]
]
