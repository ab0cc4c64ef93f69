-- busted output handler: the usual terminal output, then one line that CI
-- reads, "N passed, N failed" (errors count as failures).
return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.utfTerminal"(options)

  busted.subscribe({ "suite", "end" }, function()
    local failed = handler.failuresCount + handler.errorsCount
    io.write(string.format("\n%d passed, %d failed", handler.successesCount, failed))
    if handler.pendingsCount > 0 then
      io.write(string.format(", %d skipped", handler.pendingsCount))
    end
    io.write("\n")
    io.flush()
    return nil, true
  end, { priority = 2 })

  return handler
end
