#!/bin/bash
printf '#!/bin/bash\necho "Hi, $1."\n' > /app/greet.sh
chmod +x /app/greet.sh
