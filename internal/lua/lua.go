// Package lua holds the Lua that the dispatcher's Redis scripts share.
package lua

// WrongType defines wrongType(kt) for a script: kt lists key, type
// pairs, and it returns an error text naming the first key that holds
// another type (an absent key passes), or nil. Scripts call it before
// their first write: Redis does not undo a script's earlier writes when a
// later call fails, so a wrong-type key found half-way would leave a task
// removed from one key and in no other.
const WrongType = `
local function wrongType(kt)
  for i = 1, #kt, 2 do
    local got = redis.call('TYPE', kt[i])['ok']
    if got ~= 'none' and got ~= kt[i + 1] then
      return 'WRONGTYPE key ' .. kt[i] .. ' holds a ' .. got .. ', not a ' .. kt[i + 1] .. '; nothing changed'
    end
  end
  return nil
end
`
