std = "lua54"
max_line_length = 120
files["spec/"] = { std = "+busted" }
exclude_files = { "build/" }
